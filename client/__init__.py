"""Veil client SDK."""

from veil.client.sdk import GenerationResult, GenerationStats, VeilClient, VeilError

__all__ = ["VeilClient", "VeilError", "GenerationResult", "GenerationStats"]
