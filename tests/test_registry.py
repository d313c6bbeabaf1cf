"""Every decorator-filled table refuses a key registered twice, so a rule can
never silently replace another one that reused its op."""

import pytest
import torch

from predictor import families
from predictor.calibration import measure
from predictor.frontend import onnx_ops, training_synthesis
from predictor.kernels import layout as L
from predictor.registry import Registry

aten = torch.ops.aten


def test_a_duplicate_key_is_refused_and_the_first_entry_kept():
    table = Registry("test table")

    @table.register("a", "b")
    def first():
        pass

    def second():
        pass

    with pytest.raises(RuntimeError, match=r"test table: 'b' registered twice .*first.*second"):
        table.register("c", "b")(second)
    assert table == {"a": first, "b": first}  # "c" not filed either: all or nothing
    with pytest.raises(RuntimeError, match="registered twice"):
        table["a"] = second
    with pytest.raises(RuntimeError, match="registered twice"):
        table.update({"a": second})
    with pytest.raises(RuntimeError, match="'d' registered twice"):
        table.register("d", "d")(second)
    assert table.setdefault("a", second) is first
    assert table["a"] is first


def test_reads_are_a_plain_dicts():
    table = Registry("test table")
    table.register("x")(len)
    assert table.get("x") is len and table.get("y") is None and "x" in table
    assert isinstance(table, dict)


# The four tables, the decorator that fills each, and a key it already holds.
TABLES = [
    (families.REGISTRY, families.register, aten.mm),
    (training_synthesis.BACKWARD_RULES, training_synthesis.backward_rule, aten.mm),
    (onnx_ops.ONNX_OPS, onnx_ops.onnx_op, "Conv"),
    (measure.BUILDERS, measure.builder, L.MATMUL),
]


@pytest.mark.parametrize("table, decorator, key", TABLES,
                         ids=["extractors", "backward rules", "onnx ops", "runner builders"])
def test_each_table_is_built_through_the_registry(table, decorator, key):
    assert isinstance(table, Registry)
    assert key in table
    before = dict(table)

    def impostor(*args, **kwargs):
        raise AssertionError("never filed")

    with pytest.raises(RuntimeError, match="registered twice"):
        decorator(key)(impostor)
    assert dict(table) == before
