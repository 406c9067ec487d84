"""The simulation behind this fake SGLang: nothing here exists in real SGLang.

- ``host``: where the simulated host lives, its knobs and its GPUs (as CUDA would show them);
- ``gpus``: registering this process as a GPU user, so the host's ``nvidia-smi`` lists it;
- ``progress``: tqdm-like progress bars on stderr;
- ``faults``: the errors real runs die with (CUDA out of memory, ...);
- ``tuner``: the block-FP8 GEMM tuner behind ``benchmark/kernels/quantization/``;
- ``model``: the model's ``config.json`` and the FP8 GEMM shapes it runs;
- ``engine``: the decode scheduler of the server (timings, speculative accept length);
- ``http_api``: the server's HTTP endpoints.
"""
