"""A synthetic suite for tests/ci/test_plugin.py: items shaped like the conformance suite's
(conf_item, uncovered_op) and the AOT test's (spec, target). Not collected on its own."""
import types
import pytest

def _item(op, impl, ref=False):
    return types.SimpleNamespace(op=types.SimpleNamespace(name=op),
                                 impl=types.SimpleNamespace(name=impl, is_reference=ref))

ITEMS = [_item("rms_norm", "triton"), _item("rms_norm", "triton"), _item("rms_norm", "triton"),
         _item("attention", "torch"), _item("gdn_gate", "reference", ref=True)]

@pytest.mark.parametrize("conf_item", ITEMS, ids=["ok", "bad", "skip", "allskip", "ref"])
def test_impl(conf_item, request):
    name = request.node.callspec.id
    if name == "bad":
        pytest.fail("mismatch")
    if name in ("skip", "allskip", "ref"):
        pytest.skip("not here")

@pytest.mark.parametrize("uncovered_op", ["route_hash", "<none>"])
def test_uncovered(uncovered_op):
    pass

SPEC = types.SimpleNamespace(name="no_such_kernel", kernel=object())

@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
@pytest.mark.parametrize("spec", [SPEC])
def test_compiles(spec, target):
    assert target == "sm_90"
