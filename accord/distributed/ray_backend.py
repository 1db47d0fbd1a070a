"""``run.backend: ray``: each policy's learner and generator live in one Ray actor.

Layout. The trainer (the Ray *driver*) keeps the task, the rollout logic, advantages, logging and the
run directory. Every policy becomes a :class:`PolicyWorker` actor that builds the policy exactly as the
local backend does (:func:`accord.policies.model.build_policy`, same seed) and runs its ``generate``,
``update``, ``seed_stream``, ``save``, ``load`` and ``export``. The driver holds a
:class:`RemotePolicy` per actor: the same interface as :class:`~accord.policies.Policy`, with the
tokenizer fetched once from the actor so that ``encode_chat`` and ``decode`` run in the driver (token
ids, not chat text, go to the actor; generated ids, not text, come back).

Concurrency. ``RemotePolicy.generate`` sends the call and returns at once a list whose items are
fetched on first use, so a caller that asks each policy in turn and then reads the results has all
actors generating at the same time; ``update`` is sent the same way through
:func:`accord.distributed.submit` / :func:`~accord.distributed.gather`. Calls to one actor run in the
order they were sent.

Equivalence with ``backend: local``. A policy samples from its own ``torch.Generator`` (saved in
checkpoints), its weights depend only on its seed, and its update only on its samples, so the same
config and seed give the same rewards, losses and weights on both backends, bit for bit, provided the
matrix kernels run with the same number of threads: Ray gives an actor as many threads as the CPUs it
reserves, the local backend torch's default. Set ``run.threads`` (the driver and every actor then use
it) when results must match; without it an actor uses ``floor(num_cpus)`` threads (at least 1).
Code that draws from torch's *global* RNG inside a policy (dropout) would break the equality: the
local backend shares one global stream between policies; an actor seeds its own with its
policy's seed (:func:`accord.seeding.policy_seed`).

Placement. An actor reserves ``policies.<name>.num_cpus`` / ``num_gpus`` (default
``ray.num_cpus_per_policy`` / ``ray.num_gpus_per_policy``; fractions allowed). All actors live for the
whole run, so before any actor starts the requests are checked against ``ray.cluster_resources()``:
in total and per node (an actor runs on one node). Ray sets an actor's ``CUDA_VISIBLE_DEVICES`` to the
GPUs it reserved; the policy's ``device`` (``run.device`` or ``policies.<name>.device``) is resolved
inside the actor (:func:`accord.devices.actor_device`): ``auto`` and ``cuda`` are ``cuda:0`` there, the
first GPU Ray gave it, and the CPU when it reserved none. A policy that asks for CUDA without reserving
a GPU is an error before any actor starts.

Cluster. ``ray.address: null`` starts a private local cluster (shut down by :meth:`RayBackend.close`);
``auto``, ``HOST:PORT`` or ``ray://HOST:PORT`` join an existing one, after checking within
``ray.init_timeout_s`` that the address answers (Ray itself retries an unreachable address for
minutes). When ``ray.init`` was already called in this process (a notebook, the tests) that session
is used as is and ``ray.address`` is ignored.

Checkpoints. An actor writes and reads its own policy's files under the run directory, the driver
writes ``state.pt`` next to them: on more than one node ``run_dir`` must be on a filesystem that every
node sees at the same path (checked after each save). Every node also needs accord installed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from accord.config import Config, ConfigError, RayConfig
from accord.config.rules import check_ray_devices
from accord.policies.model import ModelPolicy
from accord.seeding import policy_seed, setup_process

logger = logging.getLogger(__name__)


class RayBackendError(ConfigError):
    """Ray cannot host the run as configured (no cluster at the address, too few resources, ...)."""


class PolicyActorError(RuntimeError):
    """A policy's actor died (out of memory, node lost, killed)."""


def _ray():
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RayBackendError("run.backend=ray needs Ray: pip install 'accord[ray]' (or pip install 'ray>=2.40'), "
                              "or set run.backend=local") from err
    return ray


def _get(refs: Any, what: str) -> Any:
    """``ray.get`` that raises a remote exception as its own type (the remote traceback chained)."""
    ray = _ray()
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = err.cause
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from err
        raise
    except ray.exceptions.RayActorError as err:
        raise PolicyActorError(
            f"the Ray actor of {what} died ({type(err).__name__}); see the Ray logs (for a local cluster "
            "/tmp/ray/session_latest/logs), give it more memory (ray.num_cpus_per_policy places fewer actors per "
            "node), and continue from the last checkpoint with `accord train --resume RUN_DIR`") from err


class RayFuture:
    """A call sent to an actor; ``result()`` waits for its value."""

    __slots__ = ("ref", "what")

    def __init__(self, ref: Any, what: str):
        self.ref, self.what = ref, what

    def result(self) -> Any:
        return _get(self.ref, self.what)


class PendingList(Sequence):
    """A list that is computed remotely: fetched (once) on first use."""

    def __init__(self, future: RayFuture):
        self._future, self._value = future, None

    def _items(self) -> list:
        if self._value is None:
            self._value = list(self._future.result())
        return self._value

    def __getitem__(self, i):
        return self._items()[i]

    def __len__(self) -> int:
        return len(self._items())

    def __iter__(self):
        return iter(self._items())

    def __repr__(self) -> str:
        return f"PendingList({self._value!r})" if self._value is not None else "PendingList(<pending>)"


# --- the actor ---------------------------------------------------------------------------------


class PolicyWorker:
    """Body of a policy's Ray actor (wrapped with ``ray.remote`` when the backend starts).

    Construction is cheap (threads only); :meth:`build` loads the model, so that a failure there comes
    back as the original exception (e.g. ModelNotFoundError) rather than as a dead actor."""

    def __init__(self, threads: int):
        setup_process(None, threads)
        self.policy: ModelPolicy | None = None

    def ready(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "gpu_ids": ray.get_gpu_ids(),
                "threads": torch.get_num_threads()}

    def build(self, cfg: Config, name: str, index: int, total_optimizer_steps: int) -> dict:
        import ray

        from accord.devices import actor_device, policy_setting
        from accord.envs.registry import import_modules
        from accord.policies.model import build_policy

        import_modules(cfg.imports)  # a loss registered by a user module runs in this process's updates
        device = actor_device(*policy_setting(cfg, name), ray.get_gpu_ids())
        setup_process(policy_seed(cfg.run.seed, index), None, cfg.run.retain_freed_memory)
        self.policy = build_policy(cfg, name, index, total_optimizer_steps, device=device)
        device = next(self.policy.model.parameters()).device
        return {"tokenizer": self.policy.tokenizer, "context_len": self.policy.context_len, "device": str(device)}

    def address(self) -> tuple[str, int]:
        """(IP, free TCP port) of this actor's node: where rank 0 of a data-parallel policy listens."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def build_rank(self, cfg: Config, name: str, index: int, total_optimizer_steps: int, rank: int, world: int,
                   address: tuple[str, int]) -> dict:
        """Rank ``rank`` of data-parallel policy ``name`` (see :mod:`accord.distributed.data_parallel`): joins
        the policy's process group at rank 0's ``address``, then builds as :meth:`build` does."""
        import ray
        import torch.distributed as dist

        from accord.devices import actor_device, policy_setting
        from accord.distributed.data_parallel import build_rank, tensor_backend
        from accord.distributed.ranks import TIMEOUT
        from accord.envs.registry import import_modules

        import_modules(cfg.imports)
        device = actor_device(*policy_setting(cfg, name), ray.get_gpu_ids())
        extra = {}
        if device.type == "cuda":  # the device first, then the group bound to it (NCCL's communicator at once)
            torch.cuda.set_device(device)
            extra["device_id"] = device
        backend = tensor_backend(device)
        dist.init_process_group(backend, init_method=f"tcp://{address[0]}:{address[1]}", rank=rank,
                                world_size=world, timeout=TIMEOUT, **extra)
        objects = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend != "gloo" else None
        setup_process(policy_seed(cfg.run.seed, index), None, cfg.run.retain_freed_memory)
        self.policy = build_rank(cfg, name, index, total_optimizer_steps, rank=rank, world=world, device=device,
                                 group=None, object_group=objects)
        device = next(self.policy.model.parameters()).device
        return {"tokenizer": self.policy.tokenizer, "context_len": self.policy.context_len, "device": str(device)}

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.policy, method)(*args, **kwargs)

    def state_dict(self) -> dict[str, torch.Tensor]:
        from accord.distributed.ranks import full_tensor  # FSDP: every rank is asked at once

        return {k: full_tensor(v).detach().cpu().clone() for k, v in self.policy.model.named_parameters()}


# --- the driver's proxy ------------------------------------------------------------------------


class RemotePolicy:
    """Driver-side stand-in for a policy that lives in a Ray actor; implements :class:`~accord.policies.Policy`."""

    # prompt handling runs here, with the tokenizer fetched from the actor: the same code as ModelPolicy's
    encode_chat = ModelPolicy.encode_chat
    decode = ModelPolicy.decode

    def __init__(self, name: str, actor: Any, cfg: Config, info: dict):
        self.name, self.actor = name, actor
        self.cfg, self.training, self.algo, self.rollout = cfg.policies[name], cfg.training, cfg.algorithm, cfg.rollout
        self.tokenizer, self.context_len = info["tokenizer"], info["context_len"]
        self.device = torch.device(info["device"])   # in the actor's process
        self.info = info

    def __repr__(self) -> str:
        return f"RemotePolicy({self.name!r}, node={self.info.get('node', '?')[:8]}, pid={self.info.get('pid')})"

    def _send(self, method: str, *args: Any, **kwargs: Any) -> RayFuture:
        return RayFuture(self.actor.call.remote(method, *args, **kwargs), f"policy {self.name!r}")

    # generation: sent at once, fetched on first use
    def generate_async(self, prompts: list[list[int]], *, greedy: bool, temperature: float,
                       stream: str | None = None, sampling: list | None = None) -> RayFuture:
        return self._send("generate", prompts, greedy=greedy, temperature=temperature, stream=stream,
                          sampling=sampling)

    def generate(self, prompts: list[list[int]], *, greedy: bool, temperature: float,
                 stream: str | None = None, sampling: list | None = None) -> PendingList:
        return PendingList(self.generate_async(prompts, greedy=greedy, temperature=temperature, stream=stream,
                                               sampling=sampling))

    def update_async(self, samples: list, step: int) -> RayFuture:
        return self._send("update", samples, step)

    def update(self, samples: list, step: int) -> dict[str, float]:
        return self.update_async(samples, step).result()

    def kl_rewards_async(self, samples: list) -> RayFuture:
        return self._send("kl_rewards", samples)

    def kl_rewards(self, samples: list) -> list[tuple[float, int]]:
        return self.kl_rewards_async(samples).result()

    def logprobs_async(self, samples: list) -> RayFuture:
        return self._send("logprobs", samples)

    def logprobs(self, samples: list) -> list[list[float]]:
        return self.logprobs_async(samples).result()

    def run_async(self, fn, *args: Any, **kwargs: Any) -> RayFuture:
        return self._send("run", fn, *args, **kwargs)

    def run(self, fn, *args: Any, **kwargs: Any) -> Any:
        """``fn(policy, *args, **kwargs)`` in the actor (see :meth:`accord.policies.Policy.run`)."""
        return self.run_async(fn, *args, **kwargs).result()

    def seed_stream(self, stream: str, seed: int) -> None:
        self._send("seed_stream", stream, seed).result()

    def save(self, directory: Path) -> None:
        self._send("save", Path(directory)).result()
        if not Path(directory).is_dir():
            raise RayBackendError(
                f"the actor of policy {self.name!r} (node {self.info.get('node')}) saved its checkpoint to "
                f"{directory}, which the trainer's process cannot see: on a multi-node Ray cluster put run.run_dir "
                "on a filesystem shared by all nodes (same path everywhere)")

    def load(self, directory: Path) -> None:
        self._send("load", Path(directory)).result()

    def export(self, directory: Path) -> None:
        self._send("export", Path(directory)).result()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """CPU copies of the actor's model parameters (name -> tensor), e.g. for tests."""
        return _get(self.actor.state_dict.remote(), f"policy {self.name!r}")


class RemoteGroup(RemotePolicy):
    """Driver-side stand-in for a data-parallel policy: its ranks' actors get every call with the same
    arguments (collectives inside make each rank's result whole); rank 0's result is returned, and an error
    of any rank is raised. ``save`` and ``export`` run on rank 0 only."""

    def __init__(self, name: str, actors: list, cfg: Config, info: dict):
        super().__init__(name, actors[0], cfg, info)
        self.actors = actors

    def __repr__(self) -> str:
        return f"RemoteGroup({self.name!r}, ranks={len(self.actors)})"

    def _send(self, method: str, *args: Any, **kwargs: Any) -> "GroupFuture":
        refs = [a.call.remote(method, *args, **kwargs) for a in self.actors]
        return GroupFuture(refs, f"policy {self.name!r}")

    def save(self, directory: Path) -> None:
        if self.training.fsdp:  # gathering the sharded state takes every rank; rank 0 writes
            self._send("save", Path(directory)).result()
        else:
            RayFuture(self.actor.call.remote("save", Path(directory)), f"policy {self.name!r}").result()
        if not Path(directory).is_dir():
            raise RayBackendError(f"rank 0 of policy {self.name!r} saved its checkpoint to {directory}, which the "
                                  "trainer's process cannot see: put run.run_dir on a filesystem shared by all nodes")

    def export(self, directory: Path) -> None:
        if self.training.fsdp:
            self._send("export", Path(directory)).result()
        else:
            RayFuture(self.actor.call.remote("export", Path(directory)), f"policy {self.name!r}").result()

    def state_dicts(self) -> list[dict[str, torch.Tensor]]:
        """Every rank's parameters (CPU copies), e.g. for tests that the ranks hold identical weights."""
        return _get([a.state_dict.remote() for a in self.actors], f"policy {self.name!r}")


class GroupFuture(RayFuture):
    """The same call sent to every rank; ``result()`` is rank 0's value."""

    def result(self) -> Any:
        return _get(self.ref, self.what)[0]


# --- cluster and placement ---------------------------------------------------------------------


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def _check_reachable(address: str, timeout: float, shown: str) -> None:
    target = _host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=timeout).close()
    except OSError as err:
        raise RayBackendError(
            f"cannot reach a Ray cluster at {shown} within ray.init_timeout_s={timeout:g}s ({err}); start one "
            "there (`ray start --head --port=PORT`; Ray Client listens on 10001), fix the address, or set "
            "ray.address=null to start a local cluster") from None


def connect(rcfg: RayConfig) -> bool:
    """Initialise Ray for the run; True when this call started a (local) cluster."""
    ray = _ray()
    if ray.is_initialized():
        logger.info("using the Ray session already initialised in this process (ray.address is not used)")
        return False
    address = rcfg.address
    if address in (None, "local"):
        ray.init(address="local", include_dashboard=False)
        return True
    if address == "auto":
        env = os.environ.get("RAY_ADDRESS")
        if env:
            _check_reachable(env, rcfg.init_timeout_s, f"RAY_ADDRESS={env!r} (ray.address=auto)")
    else:
        _check_reachable(address, rcfg.init_timeout_s, f"ray.address={address!r}")
    try:
        ray.init(address=address)
    except ConnectionError as err:
        raise RayBackendError(
            f"cannot join a Ray cluster with ray.address={address!r}: {err} Start one with `ray start --head`, "
            "give its address, or set ray.address=null to start a local cluster") from None
    return False


def actor_keys(cfg: Config, names: list[str]) -> dict[str, tuple[str, int | None]]:
    """One key per actor: the policy name, or ``name#r`` for rank r of a policy with replicas
    (key -> (policy, rank or None))."""
    out: dict[str, tuple[str, int | None]] = {}
    for n in names:
        k = cfg.policies[n].replicas
        if k is None:
            out[n] = (n, None)
        else:
            out.update({f"{n}#{r}": (n, r) for r in range(k)})
    return out


def policy_resources(cfg: Config, names: list[str]) -> dict[str, tuple[float, float]]:
    """(CPUs, GPUs) each policy's actor reserves (every rank of a policy with replicas the same)."""
    r = cfg.ray
    out = {}
    for n in names:
        p = cfg.policies[n]
        out[n] = (float(p.num_cpus if p.num_cpus is not None else r.num_cpus_per_policy),
                  float(p.num_gpus if p.num_gpus is not None else r.num_gpus_per_policy))
    return out


def check_resources(requests: dict[str, tuple[float, float]], total: dict, nodes: list[dict]) -> None:
    """Raise RayBackendError unless all actors fit the cluster at once (in total and each on one node)."""
    fixes = {
        "CPU": "lower ray.num_cpus_per_policy (fractions such as 0.5 are allowed), policies.<name>.num_cpus or "
               "policies.<name>.replicas (each rank is an actor), or give Ray more CPUs (`ray start --num-cpus=N`, "
               "or a larger cluster via ray.address)",
        "GPU": "lower ray.num_gpus_per_policy, policies.<name>.num_gpus (0: CPU only; 0.5: two policies share a "
               "GPU) or policies.<name>.replicas (each rank is an actor), or join a cluster with more GPUs via "
               "ray.address",
    }
    for i, kind in enumerate(("CPU", "GPU")):
        need = sum(v[i] for v in requests.values())
        have = float(total.get(kind, 0.0))
        largest = max((float(n.get(kind, 0.0)) for n in nodes), default=have)
        asks = ", ".join(f"{n}: {v[i]:g}" for n, v in requests.items())
        if need > have + 1e-9:
            raise RayBackendError(f"run.backend=ray: the policies' actors ask for {need:g} {kind}s in all ({asks}), "
                                  f"but the Ray cluster has {have:g}; {fixes[kind]}")
        big = [n for n, v in requests.items() if v[i] > largest + 1e-9]
        if big:
            raise RayBackendError(f"run.backend=ray: policies {big} each ask for more {kind}s than any one node has "
                                  f"({asks}; the largest node has {largest:g}); {fixes[kind]}")


class RayBackend:
    """Starts one actor per policy and releases them (and a cluster it started) on :meth:`close`."""

    def __init__(self, rcfg: RayConfig):
        self.rcfg = rcfg
        self.actors: list = []
        self.started = connect(rcfg)

    def start_policies(self, cfg: Config, names: list[str], total_optimizer_steps: int) -> dict[str, RemotePolicy]:
        """Check resources, place the actors, build every policy (concurrently); policy ``names[i]`` gets
        index ``i`` (its seed offset), as on the local backend. A policy with ``replicas: N`` gets N actors,
        the ranks of one process group (see :mod:`accord.distributed.data_parallel`)."""
        ray = _ray()
        requests = policy_resources(cfg, names)
        keys = actor_keys(cfg, names)
        per_actor = {key: requests[n] for key, (n, _) in keys.items()}
        try:  # on any failure: no actor and no cluster of ours is left behind
            from accord.distributed.data_parallel import check_replicas

            check_replicas(cfg, names, world=1)
            check_ray_devices(cfg, requests)
            alive = [n["Resources"] for n in ray.nodes() if n.get("Alive", n.get("alive", True))]
            check_resources(per_actor, ray.cluster_resources(), alive)
            worker = ray.remote(PolicyWorker)
            actors = {}
            for key in keys:
                cpus, gpus = per_actor[key]
                threads = cfg.run.threads or max(1, int(cpus))
                actors[key] = worker.options(num_cpus=cpus, num_gpus=gpus, max_restarts=0).remote(threads)
                self.actors.append(actors[key])
            ready = {key: a.ready.remote() for key, a in actors.items()}
            _, pending = ray.wait(list(ready.values()), num_returns=len(ready), timeout=self.rcfg.start_timeout_s)
            if pending:
                waiting = [key for key, ref in ready.items() if ref in pending]
                free = ray.available_resources()
                raise RayBackendError(
                    f"Ray did not place the actors of policies {waiting} within ray.start_timeout_s="
                    f"{self.rcfg.start_timeout_s:g}s: they ask for "
                    f"{', '.join(f'{k}: {per_actor[k][0]:g} CPU / {per_actor[k][1]:g} GPU' for k in waiting)}; free "
                    f"now: {free.get('CPU', 0):g} CPU / {free.get('GPU', 0):g} GPU. Other jobs (or an earlier trainer "
                    "not closed with Trainer.close()) hold them: free them, lower the requests, or raise "
                    "ray.start_timeout_s")
            where = dict(zip(keys, _get([ready[k] for k in keys], "a policy")))
            index = {n: i for i, n in enumerate(names)}
            addresses = {n: _get(actors[f"{n}#0"].address.remote(), f"policy {n!r}")
                         for n in names if cfg.policies[n].replicas is not None}
            calls = []
            for key, (n, rank) in keys.items():
                if rank is None:
                    calls.append(actors[key].build.remote(cfg, n, index[n], total_optimizer_steps))
                else:
                    calls.append(actors[key].build_rank.remote(cfg, n, index[n], total_optimizer_steps, rank,
                                                               cfg.policies[n].replicas, addresses[n]))
            built = dict(zip(keys, _get(calls, "a policy")))
        except BaseException:
            self.close()
            raise
        out = {}
        for n in names:
            ranks = [key for key, (p, _) in keys.items() if p == n]
            info = {**built[ranks[0]], **where[ranks[0]]}
            if cfg.policies[n].replicas is None:
                out[n] = RemotePolicy(n, actors[n], cfg, info)
            else:
                out[n] = RemoteGroup(n, [actors[k] for k in ranks], cfg, info)
            for key in ranks:
                logger.info("policy %s: Ray actor on node %s (pid %d), %g CPU / %g GPU, %d torch threads, model on %s",
                            key, where[key]["node"][:8], where[key]["pid"], *requests[n], where[key]["threads"],
                            built[key]["device"])
            if requests[n][1] > 0 and info["device"] == "cpu":
                logger.warning("policy %s reserves %g GPU(s) but its device setting puts its model on the CPU; set "
                               "its device to auto or cuda, or ray.num_gpus_per_policy=0 to leave the GPU to others",
                               n, requests[n][1])
        return out

    def close(self) -> None:
        """Kill the actors; shut Ray down if this backend started it."""
        ray = _ray()
        for actor in self.actors:
            try:
                ray.kill(actor)
            except (ValueError, ray.exceptions.RayError):  # not an actor handle any more, or already gone
                pass
        self.actors = []
        if self.started and ray.is_initialized():
            ray.shutdown()
        self.started = False
