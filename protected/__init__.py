"""The protected protocol: CKKS-encrypted split inference (docs/PROTOCOL.md).

``protocol`` (vocabulary, messages), ``layouts`` (slot layouts), ``weights`` (the server's encoded
layers), ``circuits`` (a layer's HE pieces), ``server`` and ``client`` (the two halves, mirrored
step for step), ``timing`` (HE time by operation kind).
"""
