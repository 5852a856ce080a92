//! How the loader hands checkpoint tensors to a backend that computes on
//! host memory: with their mapping, so the CPU reads bf16 and MXFP4 weights
//! in place, and without it under `LoadOptions::no_mmap` (`--no-mmap`), so
//! the CPU copies them; the values are the same either way.

use turbospark_cpu::{Cpu, CpuWeight, WeightData};
use turbospark_format::Checkpoint;
use turbospark_models::LoadOptions;
use turbospark_models::loader::Loader;
use turbospark_testkit::fixture_dir;

/// (head mapped, experts mapped, head's values, experts' blocks)
fn load(no_mmap: bool) -> (bool, bool, Vec<u16>, Vec<u8>) {
    let ckpt = Checkpoint::open(&fixture_dir("gpt-oss-mxfp4")).unwrap();
    let opts = LoadOptions {
        no_mmap,
        ..LoadOptions::default()
    };
    let loader = Loader::new(&Cpu, &ckpt, opts, &|_, _| {});
    let shape = ckpt.get("lm_head.weight").unwrap().shape.to_vec();
    let head: CpuWeight = loader.tensor("lm_head.weight", &shape).unwrap();
    let blocks = ckpt
        .get("model.layers.0.mlp.experts.down_proj_blocks")
        .unwrap();
    let [lead, rows, groups, _] = blocks.shape[..] else {
        panic!("blocks are 4-D")
    };
    let experts: CpuWeight = loader
        .mxfp4(
            "model.layers.0.mlp.experts.down_proj",
            lead,
            rows,
            groups * 32,
        )
        .unwrap();
    let (WeightData::BF16(h), WeightData::Mxfp4 { blocks: b, .. }) = (&head.data, &experts.data)
    else {
        panic!("a bf16 head and MXFP4 experts")
    };
    (h.is_mapped(), b.is_mapped(), h.to_vec(), b.to_vec())
}

#[test]
fn weights_stay_in_the_mapping_unless_no_mmap() {
    let (head_mapped, experts_mapped, head, experts) = load(false);
    assert!(head_mapped && experts_mapped);
    let (head_copied, experts_copied, head2, experts2) = load(true);
    assert!(!head_copied && !experts_copied);
    assert_eq!((head, experts), (head2, experts2));
}
