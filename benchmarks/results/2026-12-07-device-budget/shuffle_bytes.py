"""The first protected layer's shuffled FFN for the shipped SmolLM2 on the native backend (CPU):
``EncodedLayer.shuffle_bytes`` (what ``--protected-device-gb`` reserves per position of a WEIGHTS
step) against what two rows' shuffled W_gate|up and W_down hold, plaintext by plaintext and in
their tensors' storage. Run from the repo root:
``PYTHONSAFEPATH=1 python benchmarks/results/2026-12-07-device-budget/shuffle_bytes.py``."""
from veil.crypto.backend import make_backend
from veil.crypto.params import PROTECTED_PARAMS
from veil.engine.loader import load_checkpoint
from veil.protected.layouts import dims_of
from veil.protected.weights import EncodedLayer, ffn_permutation, layer_weights_from_tensors

ckpt = load_checkpoint(None)
be = make_backend(PROTECTED_PARAMS, "native")
dims = dims_of(ckpt.config, PROTECTED_PARAMS.slot_count)
layer = EncodedLayer(be, layer_weights_from_tensors(ckpt.tensors, ckpt.config, 2, dims), dims, shuffled=True)
gus, downs = layer.shuffled_ffn(be, [ffn_permutation(dims.ffn) for _ in range(2)])
pts = [pt for ms in (gus, downs) for m in ms for pt in m.plaintexts.values()]
storage = {p._obj.untyped_storage().data_ptr(): p._obj.untyped_storage().nbytes() for p in pts}
print(f"figure protected.shuffle_bytes {layer.shuffle_bytes}")
print(f"figure protected.shuffled_pair_bytes {gus[0].nbytes + downs[0].nbytes}  "
      f"(W_gate|up {gus[0].nbytes}, {len(gus[0].plaintexts)} of {layer.wgu.plan.diagonals_per_block} plaintexts; "
      f"W_down {downs[0].nbytes}, {len(downs[0].plaintexts)} of {layer.wdown.plan.diagonals_per_block})")
print(f"figure protected.shuffled_2_rows_nbytes {sum(p.nbytes for p in pts)} storage {sum(storage.values())} "
      f"in {len(storage)} storages")
print(f"figure protected.layer_encoded_bytes {layer.nbytes}")
