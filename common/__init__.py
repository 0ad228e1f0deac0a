"""What every stage shares and no stage teaches: CUDA plumbing, cuBLAS, config, tokenizer, sampling parameters,
the numpy reference model, synthetic checkpoints and the benchmark harness."""
