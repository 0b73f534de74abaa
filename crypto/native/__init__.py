"""Veil's native RNS-CKKS backend on torch (see ``veil.crypto.native.backend``)."""
