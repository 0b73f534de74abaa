"""The server's side of the protected path around ``veil.protected.server.ProtectedExecutor``:
tenants' evaluation keys, the executor (built on first use), and one HE worker.

* **Keys.** A client uploads its public material once (``POST /v1/keys``); it is validated
  (parameter set, sizes, every Galois step the executor needs) and imported into a key-only
  backend, stored per tenant under the SHA-256 of its bytes. Sessions name the keys they use.
  A tenant never sees or uses another tenant's keys: the store is keyed by tenant. How long a
  set is kept: ``veil.server.key_sets``.
* **Executor.** Encoding the protected layers' weights takes seconds per layer and about
  0.42 GB per layer, so it happens once, on the first protected request, not at start-up: a
  server that only serves plaintext tenants never pays for it.
* **One HE worker, batching across sessions.** Every HE computation runs on one worker thread
  (``veil.protected.scheduler``): SEAL's operations are CPU-bound and `tenseal.sealapi` holds
  the GIL while they run, so a second thread gains nothing (measured: 60 rotations took 1.37 s
  on one thread, 1.51 s on two). Steps queue FCFS; on the native backend the worker runs the
  pending steps of the same kind, layer and span of different sessions as one batched
  evaluation (``--protected-max-batch``, ``--protected-batch-wait-ms``); each session's step
  ids are checked by the executor and each session commits alone.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable

import torch

from veil.crypto.backend import HEBackend, KeyMaterialError, make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.crypto.wire import WireError
from veil.engine.split import ServerHalf
from veil.kernels import heap
from veil.protected.key_levels import relin_key_level, rotation_key_levels
from veil.protected.layouts import dims_of
from veil.protected.protocol import MAX_SPAN, ProtectedMessage, public_material_from_bytes
from veil.protected.scheduler import StepScheduler
from veil.protected.server import ProtectedExecutor, ProtectedSession
from veil.protected.weights import layer_weights_from_tensors
from veil.server.config import ServerConfig
from veil.server.key_sets import KeysError, KeySet, KeySets

log = logging.getLogger("veil.server.protected")


class ProtectedService:
    def __init__(self, half: ServerHalf, cfg: ServerConfig, compute: Callable | None = None):
        """``compute(fn)`` runs ``fn()`` where the HE work should run and returns its result:
        ``Engine.call`` where the native backend computes on the CPU, so that its torch ops use
        the engine loop's OpenMP team instead of making a second one; ``None`` runs it on the
        calling thread (the HE worker, a request's thread)."""
        self.half, self.cfg = half, cfg
        self._compute = compute or (lambda fn: fn())
        self.params = PROTECTED_PARAMS
        probe = make_backend(self.params, cfg.he_backend)  # refuses an unknown or test-only backend now
        #: the key set clients should make: a backend that hoists the baby steps is faster with a
        #: key for each; one that does not does the same work chained from step 1
        self.preferred_keys = "full" if probe.hoists_rotations else "compact"
        budget = cfg.protected_device_bytes
        if cfg.protected_max_batch < 1 or cfg.protected_batch_wait_ms < 0 or (budget is not None and budget <= 0):
            raise ValueError("protected_max_batch >= 1, protected_batch_wait_ms >= 0 and protected_device_gb > 0")
        #: why this server cannot run the protected path for its model (None: it can). A model
        #: whose dimensions the slot layouts cannot hold still serves the plaintext paths.
        self.unavailable: str | None = None
        try:
            dims = dims_of(half.config, self.params.slot_count)
        except ValueError as e:
            self.unavailable = f"the protected path cannot lay out this model's dimensions: {e}"
            log.warning("%s; serving the plaintext paths only", self.unavailable)
        #: step -> the level its key must serve: the minimal set, which every other contains
        #: (the circuits compose what it lacks: ``linear.baby_steps``, ``linear.rotate``)
        self.required_levels = {} if self.unavailable else rotation_key_levels(dims, key_set="minimal")
        self.required_relin_level = relin_key_level()
        self.keys = KeySets(cfg, self._executor_bytes)
        self._build_lock = threading.Lock()
        self._executor: ProtectedExecutor | None = None
        self._warming = False  # a warm-up in progress (/health: not ready yet)
        self._scheduler: StepScheduler | None = None  # the one HE worker (see the module doc)

    def describe(self) -> dict:
        """What a client needs before it makes its keys (``GET /health``, ``"protected"``), and
        whether the weights are encoded and a warm-up done (else the first session open waits
        for the encoding, or its first step for the warm-up)."""
        if self.unavailable:
            return {"available": False, "reason": self.unavailable}
        return {"available": True, "he_backend": self.cfg.he_backend, "param_set": self.params.id,
                "key_set": self.preferred_keys, "ready": self._executor is not None and not self._warming}

    def require(self) -> None:
        """Raise ``KeysError`` 501 where this server cannot run the protected path."""
        if self.unavailable:
            raise KeysError(501, "protected_unavailable", self.unavailable)

    def warm_up(self) -> None:
        """Encode the weights now (``--protected-warmup``). Where the native backend computes
        on the CPU, then grow the process's kept heap by what a first prompt's span takes
        (``ProtectedExecutor.span_heap_bytes``, ``kernels/heap.grow``): a fresh server's first
        prompt otherwise faults those pages in (k=28, 8 tokens, 2-core Xeon VM: TTFT 11.5-11.8 s
        against 7.8-8.3 s for the next prompts; grown at start 8.9-9.0 s; results
        2026-12-07-warmup-span). /health says
        ``ready`` once both are done. A failure is logged, not raised: the server runs on, and
        the first protected session tries the build again."""
        if self.unavailable:
            return
        self._warming = True
        try:
            ex = self.executor()
            if self.cfg.he_native_on_cpu:
                nbytes = ex.span_heap_bytes(MAX_SPAN)
                grown = self._compute(lambda: heap.grow(nbytes))
                log.info("protected warm-up: heap grown by %.2f GB of the %.2f GB a span takes", grown / 1e9,
                         nbytes / 1e9)
        except Exception:
            log.exception("protected warm-up failed; the first protected session will build the executor")
        finally:
            self._warming = False

    # ---- executor ------------------------------------------------------------------------
    def executor(self) -> ProtectedExecutor:
        with self._build_lock:
            if self._executor is None:
                t = time.perf_counter()
                tensors = self.half.model.hf_state_dict()
                cfg, dims = self.half.config, dims_of(self.half.config, self.params.slot_count)

                def build() -> ProtectedExecutor:
                    be = self._backend()  # key-less: only encodes the weights
                    weights = (layer_weights_from_tensors(tensors, cfg, i, dims)
                               for i in range(self.half.k, cfg.num_layers))
                    return ProtectedExecutor(be, cfg, weights, self.cfg.protected_limits(),
                                             key_bytes=self.keys.resident)

                self._executor = self._compute(build)
                self._scheduler = StepScheduler(self._executor, self.cfg.protected_max_batch,
                                                self.cfg.protected_batch_wait_ms / 1e3, self._compute)
                log.info("protected executor ready: layers [%d, %d), %.1f GB of encoded weights, %.1f s",
                         self.half.k, self.half.config.num_layers, self._executor.encoded_bytes / 1e9,
                         time.perf_counter() - t)
            return self._executor

    # ---- keys ----------------------------------------------------------------------------
    def add_keys(self, tenant: str, data: bytes) -> KeySet:
        self.require()
        key_id = hashlib.sha256(data).hexdigest()
        if (ks := self.keys.cached(tenant, key_id)) is not None:
            return ks
        self.keys.check_room(tenant, len(data))  # before the import, where it could not fit anyway
        try:
            material = public_material_from_bytes(data, max_bytes=len(data))
        except WireError as e:
            raise KeysError(400, "bad_keys", str(e)) from None
        if material.params_id != self.params.id:
            raise KeysError(400, "wrong_params", f"keys are for {material.params_id!r}; "
                                                 f"this server runs {self.params.id!r}")
        try:
            held = material.key_levels(self.params.top_level)
        except (TypeError, ValueError):
            raise KeysError(400, "bad_keys", "rotation levels do not match the rotation steps") from None
        short = sorted(s for s, lv in self.required_levels.items() if held.get(s, -1) < lv)
        if short:
            raise KeysError(400, "missing_rotations", f"Galois keys lack rotation steps, or levels of them: "
                                                      f"{[(s, self.required_levels[s]) for s in short[:8]]} "
                                                      "(step, level needed)")
        relin = self.params.top_level if material.relin_level is None else material.relin_level
        if relin < self.required_relin_level:
            raise KeysError(400, "missing_relin_level", f"the relinearization key serves levels <= {relin}; "
                                                        f"the circuits relinearize at {self.required_relin_level}")

        def load() -> HEBackend:
            be = self._backend()
            be.import_public_material(material)
            return be

        try:
            be = self._compute(load)
        except KeyMaterialError as e:
            raise KeysError(400, "bad_keys", str(e)) from None
        except torch.OutOfMemoryError:
            raise KeysError(503, "device_out_of_memory", "the device ran out of memory importing the keys") from None
        if be.has_secret_key:  # cannot happen through import; checked because it must never be
            raise KeysError(400, "bad_keys", "key material holds a secret key")
        return self.keys.put(KeySet(key_id, tenant, be, len(data), be.resident_bytes() or len(data)))

    def _backend(self) -> HEBackend:
        """A backend of the configured kind; the native one computes on the server's device."""
        name = self.cfg.he_backend
        return make_backend(self.params, name, **({"device": self.cfg.device} if name == "native" else {}))

    def _executor_bytes(self) -> int:
        return self._executor.device_bytes if self._executor is not None else 0

    def resident_bytes(self) -> int:
        """Memory the protected path holds: encoded weights, the shuffled W_down that sessions
        hold between steps, and every tenant's imported keys."""
        return self._executor_bytes() + self.keys.resident()

    def key_set(self, tenant: str, key_id: str) -> KeySet | None:
        return self.keys.get((tenant, key_id))

    def key_bytes(self, tenant: str | None = None) -> int:
        return self.keys.nbytes(tenant)

    # ---- sessions and steps --------------------------------------------------------------
    def open(self, keys: KeySet, session_id: str) -> ProtectedSession:
        """A new executor session (no HE work: it does not wait for the HE lock); 404 where the
        keys were dropped since the caller looked them up."""
        self.keys.acquire(keys, session_id)
        try:
            return self.executor().new_session(keys.backend, session_id)
        except BaseException:
            self.keys.release(session_id)
            raise

    def close(self, session_id: str) -> None:
        """Release a session's ciphertexts. Called from the event loop (DELETE, TTL sweep), so it
        does not wait for the HE lock: dropping the dict entry is atomic, and a step running for
        this session finishes on its own reference and is then garbage."""
        self.keys.release(session_id)
        if self._executor is not None:
            self._executor.drop_session(session_id)

    def step(self, msg: ProtectedMessage) -> tuple[ProtectedMessage, dict[str, float]]:
        """Run one client message (blocking; call from a worker thread). Returns the reply and
        the HE seconds it took by operation kind (its share of its batch's)."""
        self.executor()
        reply, seconds, _ = self._scheduler.submit(msg)
        return reply, seconds

    def working_bytes(self, session_id: str) -> int:
        """The shuffled W_down a session holds until its MLP_IN (its share of a batch's)."""
        return self._executor.session_working_bytes(session_id) if self._executor is not None else 0

    def kv_bytes(self, session_id: str | None = None) -> int:
        """Encrypted KV cache bytes of all sessions, or of one."""
        if self._executor is None:
            return 0
        if session_id is None:
            return self._executor.kv_bytes_total
        s = self._executor.sessions.get(session_id)
        return s.kv_bytes if s is not None else 0
