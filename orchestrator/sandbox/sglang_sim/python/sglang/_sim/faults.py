"""Errors real GPU runs die with, spelled as Python prints them."""

from sglang._sim.host import GPU_TOTAL_GIB


def _rebuild_oom(message):
    return OutOfMemoryError(message)


class OutOfMemoryError(RuntimeError):
    """Prints as ``torch.OutOfMemoryError: CUDA out of memory. ...`` (it pickles across processes)."""

    def __reduce__(self):
        return _rebuild_oom, self.args


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


def cuda_oom(gpu_id, tried_gib, free_mib):
    """The message of a CUDA OOM on logical GPU ``gpu_id``."""
    return OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU {gpu_id} has a total capacity "
        f"of {GPU_TOTAL_GIB:.2f} GiB of which {free_mib / 1024:.2f} GiB is free. Including non-PyTorch "
        f"memory, this process has {(GPU_TOTAL_GIB * 1024 - free_mib) / 1024:.2f} GiB memory in use. "
        "Of the allocated memory 1.12 GiB is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
