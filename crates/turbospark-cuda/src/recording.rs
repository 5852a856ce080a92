//! A recorded decode step: the instantiated CUDA graph, the arena its
//! buffers live in ([`crate::arena`]), the host's counts of the tokens it
//! chooses into batches (moved on at each replay), and a census of its
//! nodes and edges for tests and measurements (a step that is fast has
//! kernel nodes only, joined by programmatic edges). This module must not
//! launch kernels.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaGraph, DriverError, sys};

use crate::arena::Arena;

/// What a graph being recorded gathers between `begin_graph` and
/// `end_graph`: the arena its buffers come from, and the step counts of
/// the batches it chooses tokens into.
pub(crate) struct Capture {
    pub(crate) arena: Arena,
    pub(crate) steps: Vec<Arc<AtomicU64>>,
}

/// A recorded and instantiated CUDA graph with the memory of its buffers.
pub struct Recording {
    // Declared first so that it drops first: the graph goes before the
    // arena whose chunks its kernels use.
    pub(crate) graph: CudaGraph,
    pub(crate) arena: Arena,
    /// The `CudaBatch::steps` of each token choice recorded into a batch
    /// (`argmax_into_batch`): a replay runs them again, which the host
    /// would not otherwise see.
    pub(crate) steps: Vec<Arc<AtomicU64>>,
}

impl Recording {
    /// Notes on the host that a replay was queued: each batch it chooses
    /// tokens into is one choice further on.
    pub(crate) fn count_replay(&self) {
        for s in &self.steps {
            s.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: a graph may be used from any one thread at a time; `Recording`
// is not `Sync`, and the backend launches it only on its own stream.
unsafe impl Send for Recording {}

/// How many nodes of each kind a recorded graph holds, and how many of its
/// edges are programmatic (the kernel after the edge may start before the
/// one before it finishes: PDL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphNodes {
    pub kernels: usize,
    pub memsets: usize,
    pub memcpys: usize,
    pub allocs: usize,
    pub frees: usize,
    pub other: usize,
    pub edges: usize,
    pub programmatic_edges: usize,
    /// Bytes of the arena the step's buffers took.
    pub arena_bytes: u64,
}

impl Recording {
    /// The census of the recorded graph.
    pub fn nodes(&self) -> Result<GraphNodes, DriverError> {
        use sys::CUgraphNodeType as T;
        let g = self.graph.cu_graph();
        let mut census = GraphNodes {
            arena_bytes: self.arena.bytes(),
            ..GraphNodes::default()
        };
        // SAFETY: `g` is this recording's live graph; each array is sized
        // by the count the first call returns.
        unsafe {
            let mut n = 0usize;
            sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n).result()?;
            let mut nodes = vec![std::ptr::null_mut(); n];
            sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n).result()?;
            for &node in &nodes[..n] {
                let mut t = T::CU_GRAPH_NODE_TYPE_EMPTY;
                sys::cuGraphNodeGetType(node, &mut t).result()?;
                *match t {
                    T::CU_GRAPH_NODE_TYPE_KERNEL => &mut census.kernels,
                    T::CU_GRAPH_NODE_TYPE_MEMSET => &mut census.memsets,
                    T::CU_GRAPH_NODE_TYPE_MEMCPY => &mut census.memcpys,
                    T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => &mut census.allocs,
                    T::CU_GRAPH_NODE_TYPE_MEM_FREE => &mut census.frees,
                    _ => &mut census.other,
                } += 1;
            }
            let null = std::ptr::null_mut();
            let mut e = 0usize;
            let no_data = std::ptr::null_mut();
            sys::cuGraphGetEdges_v2(g, null, null, no_data, &mut e).result()?;
            let mut from = vec![std::ptr::null_mut(); e];
            let mut to = vec![std::ptr::null_mut(); e];
            let mut data = vec![std::mem::zeroed::<sys::CUgraphEdgeData>(); e];
            sys::cuGraphGetEdges_v2(
                g,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut e,
            )
            .result()?;
            census.edges = e;
            let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
            census.programmatic_edges = data[..e]
                .iter()
                .filter(|d| d.type_ == programmatic as u8)
                .count();
        }
        Ok(census)
    }
}
