"""`pytest -m slow`: every experiment's claims, as `python -m jaxlab.reproduce <paper>` checks them."""

import pytest

from jaxlab import registry, reproduce


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_claims_pass(name, tmp_path):
  res = reproduce.reproduce(name, out=str(tmp_path))
  failed = [c for c in res["claims"] if not c["passed"]]
  assert not failed, reproduce.format_table([res])
