// Rotary embedding and the KV store write that follows it: one kernel that
// serves three operations, so they share their numerics bit for bit:
// `rope` (rotate one tensor), `kv_write` (store rows of k and v, nothing
// rotates) and their fusion `rope_kv_write` (rotate q and k, store the
// rotated k and v), which makes a decode step's RoPE on q, RoPE on k and
// KV write one launch instead of three.
//
// RoPE, transformers' "rotate half" convention: pair i of a head is (i, i +
// head_dim/2); angle = f32(position) · inv_freq[i] in f32, and cos and sin
// (precise cosf/sinf, full range reduction) are multiplied by the attention
// factor before use. Only the first `pairs` pairs rotate (all of them
// unless the table is shorter, as on the CPU).
//
// The store (src/attention.rs, kernels/attention.cu) holds K and V
// `[capacity, kv_dim]` in f32 or bf16 (kv_store.cuh: a kernel for each,
// `rope_kv_write` and `rope_kv_write_bf16kv`; a bf16 store rounds the
// rotated key and the value as it stores them, k keeps the f32 rotation)
// and `slot_pos[capacity]` (i64, −1 = empty): slot p % capacity holds
// position p. When a call holds more rows than the ring
// has slots, several rows share a slot and the last one wins, as in the
// CPU's sequential loop.
//
// Work units of a row, one thread each (grid-stride): first q_heads · pairs
// rotations of q, then k_heads · (head_dim − head_dim/2) units of k and v,
// where unit t of a head owns elements t (when t < head_dim/2) and
// t + head_dim/2: a rotation pair of k when t < pairs, plain copies
// otherwise (and the last element of an odd head_dim alone). Each element
// is read and written by one thread, so rotating in place needs no
// synchronisation; a rotated k pair goes both back to k and to the store.

// The store slot of row `row`, or −1 when a later row of the call takes the
// same slot (it wins) or the store has no slots.
__device__ __forceinline__ i64 store_slot(const u32* positions, u64 row, u32 rows,
                                          u32 capacity) {
    if (capacity == 0) return -1;
    const u32 slot = positions[row] % capacity;
    if (rows > capacity) {
        for (u64 j = row + 1; j < rows; j++) {
            if (positions[j] % capacity == slot) return -1;  // superseded
        }
    }
    return slot;
}

// q `[rows, q_width]` is rotated in place (q_width = 0: no q; columns past
// the last whole head stay as they are). k and v `[rows, kv_width]` (kv_width
// = 0: no store write; otherwise a multiple of head_dim) go to the store,
// k rotated first (k is written only where it rotates, so `kv_write`, with
// pairs = 0, leaves it untouched).
template <typename S>
__device__ __forceinline__ void rope_kv(float* q, float* k, const float* v, S* kc, S* vc,
                                        i64* slot_pos, const u32* positions,
                                        const RopeFreqs& freqs, float factor, u32 rows,
                                        u32 q_width, u32 kv_width, u32 head_dim, u32 pairs,
                                        u32 capacity) {
    const u32 half = head_dim / 2, span = head_dim - half;
    const u64 q_units = (u64)(q_width / head_dim) * pairs;
    const u64 units = q_units + (u64)(kv_width / head_dim) * span;
    FOR_EACH(idx, (u64)rows * units) {
        const u64 r = idx / units, unit = idx % units;
        const u32 pos = positions[r];
        if (unit < q_units) {
            const u32 i = (u32)(unit % pairs);
            float* p = q + r * q_width + (unit / pairs) * head_dim;
            rotate_pair(p[i], p[i + half], pos, freqs.f[i], factor);
            continue;
        }
        const u64 w = unit - q_units;
        const u32 t = (u32)(w % span);
        const u64 col = (w / span) * head_dim + t;
        const u64 src = r * kv_width + col;
        float a = t < half ? k[src] : 0.0f, b = k[src + half];
        if (t < pairs) {
            rotate_pair(a, b, pos, freqs.f[t], factor);
            k[src] = a;
            k[src + half] = b;
        }
        const i64 slot = store_slot(positions, r, rows, capacity);
        if (slot < 0) continue;
        const u64 dst = (u64)slot * kv_width + col;
        if (t < half) {
            kv_put(kc, dst, a);
            kv_put(vc, dst, v[src]);
        }
        kv_put(kc, dst + half, b);
        kv_put(vc, dst + half, v[src + half]);
        if (w == 0) slot_pos[slot] = (i64)pos;
    }
}

#define ROPE_KV_WRITE(name, S)                                                                   \
    extern "C" __global__ void name(float* q, float* k, const float* v, S* kc, S* vc,            \
                                    i64* slot_pos, const u32* positions, RopeFreqs freqs,        \
                                    float factor, u32 rows, u32 q_width, u32 kv_width,           \
                                    u32 head_dim, u32 pairs, u32 capacity) {                     \
        pdl_enter();                                                                             \
        rope_kv<S>(q, k, v, kc, vc, slot_pos, positions, freqs, factor, rows, q_width, kv_width, \
                   head_dim, pairs, capacity);                                                   \
    }
ROPE_KV_WRITE(rope_kv_write, float)
ROPE_KV_WRITE(rope_kv_write_bf16kv, u16)
