"""Negacyclic NTT over each limb of ``[..., limbs, N]`` residue tensors, and automorphisms.

Convention (SEAL's, so NTT-form residues equal SEAL's bit for bit): ``psi`` is the smallest
primitive 2N-th root of unity mod q; the forward transform is the merged Cooley-Tukey
butterfly network with twiddles ``psi^brev(k)`` and leaves slot ``j`` holding the evaluation
``a(psi^(2*brev(j) + 1))`` (bit-reversed order); the inverse is the Gentleman-Sande network
with ``psi^-brev(k)``, the factor ``1/N`` folded into its last stage. One stage is one batched
operation over every limb and leading dim (a loop over log N stages, never over coefficients).
On CUDA tensors the transforms run as Triton kernels (``veil.kernels.ckks_ntt``: the same
network, tables and lazy-reduction plan, up to four stages per launch over every limb), on CPU tensors as a C kernel
(``veil.kernels.ckks_cpu``: the same network, all stages of a limb in cache) where a C
compiler is present; this torch code is their twin (``NttTables.twin``).

In NTT form an automorphism ``X -> X^g`` is a permutation of the evaluation points, the same
for every prime: ``automorphism_index(g)`` gives the gather index.
"""

from __future__ import annotations

import functools

import torch

from veil.crypto.native.modarith import Basis, MulConst, _PartConst
from veil.kernels import ckks_cpu
from veil.kernels.ckks_arith import use_triton
from veil.kernels.ckks_ntt import NttPack, ntt_triton

__all__ = ["NttTables", "bit_reverse", "min_root_2n", "automorphism_index", "automorphisms", "coeff_automorphism"]


def bit_reverse(n: int) -> list[int]:
    """``brev`` over ``log2 n`` bits for ``0..n-1``."""
    bits = n.bit_length() - 1
    return [int(f"{i:0{bits}b}"[::-1], 2) if bits else 0 for i in range(n)]


def min_root_2n(q: int, n: int) -> int:
    """The smallest primitive ``2n``-th root of unity mod ``q`` (what SEAL's NTT uses)."""
    if (q - 1) % (2 * n):
        raise ValueError(f"{q} is not 1 mod {2 * n}")
    x, g = 2, None
    while g is None:
        cand = pow(x, (q - 1) // (2 * n), q)
        if pow(cand, n, q) == q - 1:  # order exactly 2n (2n is a power of two)
            g = cand
        x += 1
    best, cur, g2 = g, g, g * g % q
    for _ in range(n):
        best = min(best, cur)
        cur = cur * g2 % q
    return best


@functools.lru_cache(maxsize=64)
def _twiddles(q: int, n: int) -> tuple[list[int], list[int], int]:
    psi = min_root_2n(q, n)
    ipsi = pow(psi, -1, q)
    fw, inv = [1] * n, [1] * n
    for i in range(1, n):
        fw[i] = fw[i - 1] * psi % q
        inv[i] = inv[i - 1] * ipsi % q
    rev = bit_reverse(n)
    return [fw[r] for r in rev], [inv[r] for r in rev], pow(n, -1, q)


def _fw_stage(x: torch.Tensor, w: _PartConst, m: int) -> torch.Tensor:
    """One Cooley-Tukey stage on ``[B, L, N]`` with ``m`` groups: ``(u + w*v, u - w*v)``."""
    b, limbs, n = x.shape
    v = x.view(b, limbs, m, 2, n // (2 * m))
    u, p = v[:, :, :, 0], w.mul_lazy(v[:, :, :, 1])
    return torch.stack((u + p, u - p), dim=3).view(b, limbs, n)


def _inv_stage(x: torch.Tensor, w: _PartConst, h: int) -> torch.Tensor:
    """One Gentleman-Sande stage with ``h`` groups: ``(u + v, w*(u - v))``."""
    b, limbs, n = x.shape
    v = x.view(b, limbs, h, 2, n // (2 * h))
    u, y = v[:, :, :, 0], v[:, :, :, 1]
    return torch.stack((u + y, w.mul_lazy(u - y)), dim=3).view(b, limbs, n)


def _inv_last(x: torch.Tensor, lo: _PartConst, hi: _PartConst) -> torch.Tensor:
    """The last inverse stage with the factor ``1/N`` folded in; ends canonical."""
    b, limbs, n = x.shape
    v = x.view(b, limbs, 1, 2, n // 2)  # the constants are [L, 1, 1] like the stages' twiddles
    u, y = v[:, :, :, 0], v[:, :, :, 1]
    out = torch.stack((lo.mul_lazy(u + y), hi.mul_lazy(u - y)), dim=3).view(b, limbs, n)
    return out + ((out >> 63) & lo.q.view(-1, 1))


def _reduce(x: torch.Tensor, q: torch.Tensor, qinv: torch.Tensor, canonical: bool) -> torch.Tensor:
    """``-> (-q, q)``, or ``[0, q)`` (``modarith.Basis.reduce``)."""
    r = x - torch.round(x.to(torch.float64) * qinv).to(torch.int64) * q
    return r + ((r >> 63) & q) if canonical else r


@functools.cache
def compiled(fn):
    """``torch.compile`` of a hot function with dynamic shapes. On the CPU it fuses a butterfly
    stage's dozen elementwise operations into one pass over memory; the integer results equal
    eager ones (tests compare them). Sizes of 1 (one limb, one polynomial, the first and last
    stage's group sizes) and the two product schemes each get their own graph, more than
    Dynamo's default of 8 per function, hence the higher limit while these run."""
    fn_c = torch.compile(fn, dynamic=True)

    @functools.wraps(fn)
    def call(*args):
        with torch._dynamo.config.patch(recompile_limit=64):
            return fn_c(*args)

    return call


class _RunNtt:
    """The transforms of one run of limbs (one product scheme), with lazy butterflies: sums are
    not reduced; a value's bound grows by ``q`` per forward stage and doubles per inverse stage,
    and the whole array is brought back to ``(-q, q)`` only when the next stage's product would
    leave its precondition (``limit``, see ``modarith``). For the 36-bit primes that is never in
    a forward transform and once in an inverse one; for the 57-bit primes every 31 stages.
    Input and output ``[B, L, N]``; each stage is one function (``compile``: one fused kernel)."""

    def __init__(self, fw: MulConst, inv: MulConst, last_lo: MulConst, last_hi: MulConst,
                 q: torch.Tensor, qinv: torch.Tensor, limit: float, qmax: int) -> None:
        [(_, _, self.fw)], [(_, _, self.inv)] = fw.parts, inv.parts
        [(_, _, self.last_lo)], [(_, _, self.last_hi)] = last_lo.parts, last_hi.parts
        self.q, self.qinv, self.limit, self.qmax = q, qinv, limit, float(qmax)  # q: [L, 1]

    def plan(self, n: int, inverse: bool) -> list[bool]:
        """Per stage, in order, whether the array is first reduced to ``(-q, q)``: a forward
        stage adds ``q`` to the bound, an inverse one doubles it (and multiplies the doubled
        difference), and a product's operand must stay below ``limit``. The Triton transforms
        (``veil.kernels.ckks_ntt``) follow the same plan."""
        out, bound = [], self.qmax
        for _ in range(n.bit_length() - 1):
            grown = 2 * bound if inverse else bound
            out.append(grown >= self.limit)
            bound = self.qmax if out[-1] else bound
            bound = 2 * bound if inverse else bound + self.qmax
        return out

    def forward(self, x: torch.Tensor, n: int, compile: bool) -> torch.Tensor:
        stage, reduce = (compiled(_fw_stage), compiled(_reduce)) if compile else (_fw_stage, _reduce)
        for s, first_reduce in enumerate(self.plan(n, inverse=False)):
            m = 1 << s
            if first_reduce:
                x = reduce(x, self.q, self.qinv, False)
            x = stage(x, self.fw.map(lambda w, m=m: w[:, m : 2 * m]), m)
        return reduce(x, self.q, self.qinv, True)

    def inverse(self, x: torch.Tensor, n: int, compile: bool) -> torch.Tensor:
        stage, reduce = (compiled(_inv_stage), compiled(_reduce)) if compile else (_inv_stage, _reduce)
        last = compiled(_inv_last) if compile else _inv_last
        for s, first_reduce in enumerate(self.plan(n, inverse=True)):
            h = n >> (s + 1)
            if first_reduce:
                x = reduce(x, self.q, self.qinv, False)
            if h > 1:
                x = stage(x, self.inv.map(lambda w, h=h: w[:, h : 2 * h]), h)
            else:
                x = last(x, self.last_lo, self.last_hi)
        return x


class NttTables:
    """Twiddles of one basis at ring degree ``n``, on the basis's device, per run of limbs.
    ``compile=True`` runs the transforms through ``torch.compile`` (``compiled``)."""

    def __init__(self, basis: Basis, n: int, compile: bool = False) -> None:
        self.basis, self.n, self.compile = basis, n, compile
        dev = basis.device
        fw, inv, last_lo, last_hi = [], [], [], []
        for q in basis.primes:
            f, i, n_inv = _twiddles(q, n)
            fw.append(f)
            inv.append(i)
            last_lo.append(n_inv)
            last_hi.append(i[1] * n_inv % q)
        as_t = functools.partial(torch.tensor, dtype=torch.int64, device=dev)
        self._fw = basis.const(as_t(fw).unsqueeze(-1))  # [L, N, 1]
        self._inv = basis.const(as_t(inv).unsqueeze(-1))
        # the inverse's last stage: lo * n^-1, hi * psi^-brev(1) * n^-1
        self._last_lo = basis.const(as_t(last_lo).view(-1, 1, 1))
        self._last_hi = basis.const(as_t(last_hi).view(-1, 1, 1))
        self._root, self._span, self._views = self, (0, len(basis)), {}
        self._build_runs()

    def _build_runs(self) -> None:
        self.runs = []
        for a, b, part in self.basis.parts:
            s = slice(a, b)
            run = _RunNtt(self._fw.limbs(s), self._inv.limbs(s), self._last_lo.limbs(s),
                          self._last_hi.limbs(s), self.basis.q[s], self.basis.qinv[s], part.limit,
                          max(self.basis.primes[s]))
            self.runs.append((a, b, run))

    def limbs(self, s: slice) -> NttTables:
        """The tables of a run of limbs (views, no recomputation; one object per run, kept by
        the master tables, so what a view caches is built once)."""
        start, stop, _ = s.indices(len(self.basis))
        root, base = self._root, self._span[0]
        key = (base + start, base + stop)
        if key not in root._views:
            out = object.__new__(NttTables)
            out.basis, out.n, out.compile = root.basis.limbs(slice(*key)), root.n, root.compile
            out._fw, out._inv = root._fw.limbs(slice(*key)), root._inv.limbs(slice(*key))
            out._last_lo, out._last_hi = root._last_lo.limbs(slice(*key)), root._last_hi.limbs(slice(*key))
            out._root, out._span, out._views = root, key, None
            out._build_runs()
            root._views[key] = out
        return root._views[key]

    @functools.cached_property
    def triton_pack(self) -> dict[bool, NttPack]:
        """Both directions' constants for the Triton transforms (``ckks_ntt.NttPack``): views of
        the master tables' fields stacked over their runs, with this run's own reduction plans."""
        root, (a, b) = self._root, self._span
        lo, hi = ([f[a:b] for f in t.stacked[:4]] for t in (root._last_lo, root._last_hi))
        out = {}
        for inverse in (False, True):
            *tw, c = (root._inv if inverse else root._fw).stacked
            plan = [row for s, e, run in self.runs for row in [run.plan(self.n, inverse)] * (e - s)]
            out[inverse] = NttPack(tuple(f[a:b] for f in tw), c[a:b], tuple(lo), tuple(hi),
                                   torch.tensor(plan, dtype=torch.int32, device=self.basis.device))
        return out

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.n or x.shape[-2] != len(self.basis):
            raise ValueError(f"expected [..., {len(self.basis)}, {self.n}], got {tuple(x.shape)}")

    def _each(self, x: torch.Tensor, inverse: bool, centre: bool = False) -> torch.Tensor:
        self._check(x)
        if use_triton(x):  # the same transform, up to four stages per Triton launch (centred there)
            return ntt_triton(self, x, inverse, centre=centre)
        if x.device.type == "cpu" and ckks_cpu.available():  # the same transform, in C (centred there)
            return ckks_cpu.ntt_cpu(self.basis.primes, x, inverse, centre)
        out = self.twin(x, inverse)
        return self.basis.center(out) if centre else out

    def twin(self, x: torch.Tensor, inverse: bool) -> torch.Tensor:
        """The transform in torch, one batched operation per stage: the kernels' reference."""
        self._check(x)
        shape = x.shape
        x = x.reshape(-1, shape[-2], self.n)  # one rank for every caller: one compiled graph

        def run(r: _RunNtt, y: torch.Tensor) -> torch.Tensor:
            y = y.contiguous()
            return r.inverse(y, self.n, self.compile) if inverse else r.forward(y, self.n, self.compile)

        if len(self.runs) == 1:
            return run(self.runs[0][2], x).reshape(shape)
        return torch.cat([run(r, x[:, a:b]) for a, b, r in self.runs], dim=-2).reshape(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Coefficients (any ``|x| < q``) -> NTT form in ``[0, q)`` (bit-reversed evaluations)."""
        return self._each(x, inverse=False)

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        """NTT form (``|x| < q``) -> coefficients ``[0, q)``."""
        return self._each(x, inverse=True)

    def lift(self, coeffs: torch.Tensor) -> torch.Tensor:
        """Integer coefficients ``[..., N]`` (``|c| < 2^62``) -> NTT-form residues ``[..., L, N]``
        in ``[0, q)``: on the CPU one C pass per limb (the reduction read inside the NTT), on CUDA
        the reduction in the Triton transform's first launch, elsewhere reduced, then the NTT."""
        if coeffs.device.type == "cpu" and ckks_cpu.available():
            return ckks_cpu.ntt_reduced_cpu(self.basis.primes, coeffs.unsqueeze(-2))
        if use_triton(coeffs):
            return ntt_triton(self, coeffs, inverse=False, lift=True)
        return self.forward(self.basis.reduce(coeffs.unsqueeze(-2)))

    def inverse_centred(self, x: torch.Tensor) -> torch.Tensor:
        """NTT form -> centred coefficients ``(-q/2, q/2]``: ``basis.center(inverse(x))``, which the
        C kernel does while each row is in cache (key-switch digits, ModDown, rescale)."""
        return self._each(x, inverse=True, centre=True)


@functools.lru_cache(maxsize=512)
def _automorphism_index_list(g: int, n: int) -> tuple[int, ...]:
    rev = bit_reverse(n)
    pos = {2 * r + 1: j for j, r in enumerate(rev)}  # evaluation exponent -> NTT slot
    return tuple(pos[(2 * rev[j] + 1) * g % (2 * n)] for j in range(n))


def automorphism_index(g: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gather index ``idx`` with ``ntt(a(X^g))[..., j] = ntt(a)[..., idx[j]]`` (odd ``g``)."""
    if g % 2 == 0:
        raise ValueError("a Galois element is odd")
    return torch.tensor(_automorphism_index_list(g % (2 * n), n), dtype=torch.int64, device=device)


def automorphisms(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """NTT-form ``x [G, ..., N]`` with group ``g`` gathered by ``index[g]`` (``[G, N]``, rows of
    ``automorphism_index``): the C kernel on the CPU, ``torch.gather`` (its twin) elsewhere."""
    if x.device.type == "cpu" and ckks_cpu.available():
        return ckks_cpu.gather_cpu(x, index)
    view = index.reshape(index.shape[0], *([1] * (x.dim() - 2)), index.shape[-1])
    return torch.gather(x, -1, view.expand(x.shape))


def coeff_automorphism(x: torch.Tensor, g: int, basis: Basis) -> torch.Tensor:
    """``a(X) -> a(X^g)`` on coefficients ``[0, q)`` (``X^N = -1``): a signed permutation."""
    n = x.shape[-1]
    e = torch.arange(n, device=x.device) * g % (2 * n)
    out = torch.zeros_like(x)
    src = x.clone()
    neg = e >= n
    src[..., neg] = basis.neg(src[..., neg])
    out[..., e % n] = src
    return out
