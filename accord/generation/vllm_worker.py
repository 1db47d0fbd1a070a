"""Weight pushes into a vLLM engine that runs in its own process on the learner's GPU.

With ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` the engine's worker lives in another process, so the learner's
tensors cannot be handed over as objects. Writing the weights to disk after every update (what accord
did before) costs a full fp32 copy through the filesystem per step. Instead the learner exports a CUDA IPC
handle of each parameter (:func:`ipc_payload`, ``torch.multiprocessing.reductions.reduce_tensor``: no
copy) and the worker, extended with :class:`WeightReceiver` (vLLM's ``worker_extension_cls``), opens the
handles as tensors on its own GPU and loads them with vLLM's in-place ``reload_weights`` (the model's
``load_weights`` on a vLLM without it), which copies them into the engine's parameters (converting fp32
to the engine's dtype). Both processes see the same GPU (colocated), so the copy never leaves it.

The handles travel as one pickled ``bytes`` argument of ``LLM.collective_rpc`` (msgpack carries bytes
as they are, so vLLM's insecure-serialisation switch stays off); they come from this job's own trainer
over vLLM's local socket. The call returns once the worker has synchronised its stream, so the
learner's next optimizer step cannot race the copy; the learner synchronises before sending, so the
engine never reads a half-written step.

This module is imported inside vLLM's worker process by name (:data:`accord.generation.vllm_backend.
WORKER_EXTENSION`); it imports nothing of vLLM and nothing heavy of accord.
"""

from __future__ import annotations

import inspect
import pickle

import torch

DEVICE_ARG = 6  # position of the device index among rebuild_cuda_tensor's arguments


def ipc_payload(state: dict[str, torch.Tensor]) -> bytes:
    """CUDA IPC handles of ``state``'s tensors (name -> tensor, all on one CUDA device), pickled."""
    from torch.multiprocessing.reductions import reduce_tensor

    items = []
    for name, tensor in state.items():
        _, args = reduce_tensor(tensor.detach())
        items.append((name, args))
    return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)


def open_payload(payload: bytes, device_index: int) -> list[tuple[str, torch.Tensor]]:
    """The tensors of :func:`ipc_payload`'s handles, opened on this process's GPU ``device_index``."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    weights = []
    for name, args in pickle.loads(payload):  # our own trainer's handles (see the module docstring)
        args = list(args)
        args[DEVICE_ARG] = device_index  # the sender's index need not be ours (CUDA_VISIBLE_DEVICES)
        weights.append((name, rebuild_cuda_tensor(*args)))
    return weights


def takes_iterator(reload) -> bool:
    """Whether a model runner's ``reload_weights`` accepts tensors (``weights_iterator``), not only a path."""
    if reload is None:
        return False
    try:
        return "weights_iterator" in inspect.signature(reload).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


class WeightReceiver:
    """Mixed into vLLM's GPU worker (``LLM(worker_extension_cls=...)``): ``self`` is the worker."""

    def accord_load_ipc_weights(self, payload: bytes) -> int:
        """Load the learner's weights from their IPC handles; returns how many tensors were loaded."""
        device = getattr(self, "device", None)
        index = device.index if isinstance(device, torch.device) and device.index is not None \
            else torch.cuda.current_device()
        weights = open_payload(payload, index)
        if takes_iterator(getattr(self.model_runner, "reload_weights", None)):
            self.reload_weights(weights_iterator=weights)
        else:  # a vLLM whose reload_weights reads only from disk: the model's own loader
            self.model_runner.model.load_weights(weights)
        torch.cuda.synchronize(index)
        count = len(weights)
        del weights  # close the handles before the learner writes its parameters again
        return count
