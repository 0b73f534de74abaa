"""Schemathesis against the app's own OpenAPI schema on a real loopback server: every
operation, about 300 generated requests in all (valid and invalid bodies, paths and
parameters), authenticated as a tenant with both scopes. Check: no 5xx. The server is
configured small (max_context 64) so that generated completion requests stay cheap.
The long run (10,000 cases) is `python -m veil.benchmarks.fuzz_api`."""

import pytest

from veil.benchmarks.fuzz_api import fuzz


@pytest.fixture(scope="module")
def fuzz_server(ckpt, tmp_path_factory, live_server_cls):
    srv = live_server_cls(ckpt, tmp_path_factory.mktemp("fuzz"), max_context=64, max_step_tokens=64)
    yield srv
    srv.stop()


def test_no_server_errors(fuzz_server):
    # 60 per operation; operations with small input spaces stop earlier: ~300 in all
    ran, failures = fuzz(fuzz_server.url, fuzz_server.keys["bob"], 60)
    print(f"schemathesis: {sum(ran.values())} cases over {len(ran)} operations")
    assert not failures, failures
    assert len(ran) >= 8 and sum(ran.values()) >= 250, ran
