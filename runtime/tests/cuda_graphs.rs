//! The CUDA-graph choice (`runtime::offload::cuda_graphs_policy`), in a process of its own
//! since it is made once per process: a serving process that says nothing gets ggml-cuda's
//! graphs off through `GGML_CUDA_DISABLE_GRAPHS`, which ggml-cuda reads when it first
//! computes.

#[test]
fn a_server_turns_cuda_graphs_off_unless_asked() {
    if std::env::var_os("RLLAMA_CUDA_GRAPHS").is_some()
        || std::env::var_os("GGML_CUDA_DISABLE_GRAPHS").is_some()
    {
        eprintln!("skipping: RLLAMA_CUDA_GRAPHS or GGML_CUDA_DISABLE_GRAPHS set by the caller");
        return;
    }
    // As rserve asks, first thing in main.
    assert!(!runtime::offload::cuda_graphs_policy(false));
    assert_eq!(
        std::env::var("GGML_CUDA_DISABLE_GRAPHS").as_deref(),
        Ok("1")
    );
    // Decided once: the offload's own later call (default on) gets the same answer.
    assert!(!runtime::offload::cuda_graphs_policy(true));
}
