"""The SEAL backend: Microsoft SEAL through ``tenseal.sealapi`` (``make_backend(params, "seal")``)."""
