"""What every stage stands on and no stage teaches: CUDA plumbing, cuBLAS, config, checkpoints, tokenizer,
sampling parameters, and the numpy references; bench/ holds the measuring tools, course/ the course's generators,
serve/ the server."""
