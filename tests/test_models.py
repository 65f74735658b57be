"""Model zoo: parameter counts, graph structure, overrides and bad model TOMLs."""

from __future__ import annotations

from pathlib import Path

import pytest

import planner
from planner.ir.graph import Graph, Repeat, graph_flops, parameter_count
from tilecommon.errors import ConfigError


def _vit_params(h: int, mlp: int, patch: int, channels: int, tokens: int, layers: int) -> int:
    per_layer = 4 * (h * h + h) + (h * mlp + mlp) + (mlp * h + h) + 4 * h
    return (channels * patch * patch + 1) * h + tokens * h + layers * per_layer + 2 * h


def _vit_flops(h: int, mlp: int, patch: int, channels: int, tokens: int, layers: int) -> int:
    per_layer = 4 * tokens * h * h + 2 * tokens * h * mlp + 2 * tokens * tokens * h
    return 2 * (tokens * channels * patch * patch * h + layers * per_layer)


def test_siglip_so400m_has_exactly_412987248_parameters() -> None:
    g = planner.load_model("siglip-so400m")
    assert parameter_count(g) == 412_987_248


@pytest.mark.parametrize(
    "name, dims",
    [
        ("vit-tiny", (192, 768, 16, 3, 197, 2)),
        ("siglip-so400m", (1152, 4304, 14, 3, 729, 27)),
    ],
)
def test_zoo_counts_match_formula(name: str, dims: tuple[int, ...]) -> None:
    g = planner.load_model(name)
    assert parameter_count(g) == _vit_params(*dims)
    assert graph_flops(g) == _vit_flops(*dims)
    a = dict(g.attrs)
    assert (a["hidden"], a["mlp"], a["patch"], a["channels"], a["tokens"], a["layers"]) == dims


# published parameter counts: bert-base-uncased and all-MiniLM-L6-v2 (their
# model cards' safetensors: 109,482,240 and 22,713,216 elements, pooler
# included), Qwen2.5-0.5B (494,032,768, embeddings tied), the PE-Core-L14
# probe (317,150,208: attention-pooling head and output projection) and the
# SigLIP so400m tower with its MAP head (428,225,600)
PUBLISHED = {"bert-base": 109_482_240, "minilm-l6": 22_713_216, "qwen2.5-0.5b": 494_032_768,
             "pe-core-l14": 317_150_208, "siglip-so400m-map": 428_225_600}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_zoo_parameter_counts_are_the_published_ones(name: str) -> None:
    from planner.ir.graph import model_parameter_count

    assert model_parameter_count(planner.load_model(name)) == PUBLISHED[name]


def test_zoo_names_and_attrs() -> None:
    assert planner.zoo_names() == ["bert-base", "minilm-l6", "pe-core-l14", "qwen2.5-0.5b",
                                   "siglip-so400m", "siglip-so400m-map", "vit-micro",
                                   "vit-tiny"]
    g = planner.load_model("siglip-so400m")
    assert dict(g.attrs)["eps"] == 1e-6 and g.attr_int("heads") == 16
    assert dict(planner.load_model("pe-core-l14").attrs)["eps"] == 1e-5


def _encoder(g: Graph) -> Repeat:
    rep = g.op("encoder")
    assert isinstance(rep, Repeat)
    return rep


def test_graph_structure(micro_graph: Graph) -> None:
    g = micro_graph
    assert [op.kind for op in g.ops] == ["Cast", "MatMul", "Add", "Repeat", "LayerNorm"]
    assert g.inputs == ("patches",) and g.outputs == ("out",)
    assert g.tensor("patches").shape == (20, 48) and g.tensor("patches").dtype == "fp16"
    assert g.tensor("out").shape == (20, 32) and g.tensor("out").dtype == "fp16"
    assert g.tensor("pos_embed").shape == (10, 32)
    rep = _encoder(g)
    assert rep.trips == 2 and rep.init == ("x0",) and rep.final == ("xL",)
    assert [op.kind for op in rep.body.ops] == [
        "LayerNorm", "Cast", "MatMul", "SplitHeads", "MatMul", "SplitHeads", "MatMul",
        "SplitHeads", "BatchMatMul", "Softmax", "BatchMatMul", "MergeHeads", "Cast", "MatMul",
        "Add", "LayerNorm", "Cast", "MatMul", "Gelu", "Cast", "MatMul", "Add",
    ]
    assert rep.body.tensor("scores").shape == (4, 10, 10)
    assert rep.body.op("softmax").scale == pytest.approx(1 / 4.0)  # dh = 16
    for outer, inner in rep.iterated:
        assert outer == f"layers.{inner}"
        assert g.tensor(outer).shape == (2, *rep.body.tensor(inner).shape)
    assert g.tensor("layers.w_fc1").dtype == "fp8" and g.tensor("layers.w_fc1").scale_exp < 0
    assert g.tensor("layers.b_fc1").dtype == "fp16"
    assert rep.invariant == ()


def test_overrides_and_precision(micro_toml: Path) -> None:
    g = planner.load_model(micro_toml, layers=3, batch=1)
    assert _encoder(g).trips == 3 and g.tensor("layers.w_q").shape == (3, 32, 32)
    assert g.tensor("patches").shape == (10, 48)
    assert dict(g.attrs)["layers"] == 3 and dict(g.attrs)["batch"] == 1
    g32 = planner.load_model(micro_toml, precision="fp32")
    assert {t.dtype for t in g32.tensors} == {"fp32"}
    assert {t.dtype for t in _encoder(g32).body.tensors} == {"fp32"}
    assert parameter_count(g32) == parameter_count(planner.load_model(micro_toml))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "model.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "edit, field, message",
    [
        (lambda s: s.replace('hidden = 32\n', ''), "hidden", "missing"),
        (lambda s: s + 'dropout = 0.1\n', "dropout", "unknown field"),
        (lambda s: s.replace('heads = 2', 'heads = "2"'), "heads", "must be int"),
        (lambda s: s.replace('heads = 2', 'heads = 2.0'), "heads", "must be an integer"),
        (lambda s: s.replace('layers = 2', 'layers = true'), "layers", "must be int"),
        (lambda s: s.replace('tokens = 10', 'tokens = 0'), "tokens", "out of range"),
        (lambda s: s.replace('eps = 1e-6', 'eps = 0.5'), "eps", "out of range"),
        (lambda s: s.replace('heads = 2', 'heads = 3'), "heads", "must divide hidden"),
        (lambda s: s.replace('name = "vit-micro"', 'name = ""'), "name", "non-empty"),
        (lambda s: s.replace('hidden = 32', 'hidden = [32'), "toml", "not valid TOML"),
    ],
)
def test_bad_model_toml(tmp_path: Path, micro_toml: Path, edit, field: str, message: str) -> None:
    path = _write(tmp_path, edit(micro_toml.read_text()))
    with pytest.raises(ConfigError, match=message) as info:
        planner.load_model(path)
    assert info.value.field == field and info.value.source == str(path)
    assert str(path) in str(info.value) and f"'{field}'" in str(info.value)


def test_bad_names_and_overrides(micro_toml: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such zoo model") as info:
        planner.load_model("vit-huge")
    assert info.value.field == "model"
    with pytest.raises(ConfigError, match="file not found"):
        planner.load_model(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="override") as info:
        planner.load_model(micro_toml, layers=0)
    assert info.value.field == "layers"
    with pytest.raises(ConfigError) as info:
        planner.load_model(micro_toml, batch=-1)
    assert info.value.field == "batch"
    with pytest.raises(ConfigError) as info:
        planner.load_model(micro_toml, precision="bf16")
    assert info.value.field == "precision"


def test_batch_defaults_to_one(tmp_path: Path, micro_toml: Path) -> None:
    g = planner.load_model(_write(tmp_path, micro_toml.read_text().replace("batch = 2\n", "")))
    assert g.attr_int("batch") == 1 and g.tensor("patches").shape == (10, 48)


_LLM = {"name": "t", "input": "embeddings", "hidden": 32, "heads": 4, "mlp": 48, "tokens": 8,
        "layers": 1, "eps": 1e-6, "norm": "rmsnorm", "activation": "swiglu",
        "attention": "causal", "rope_theta": 100.0, "pool": "last", "vocab": 20}


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"activation": "relu"}, "activation", "must be one of"),
    ({"block": "sandwich"}, "block", "must be one of"),
    ({"norm": "batchnorm"}, "norm", "must be one of"),
    ({"attention": "sliding"}, "attention", "must be one of"),
    ({"kv_heads": 3}, "kv_heads", "must divide heads"),
    ({"kv_heads": 0}, "kv_heads", "out of range"),
    ({"rope_theta": "big"}, "rope_theta", "must be float"),
    ({"hidden": 36, "heads": 4, "mlp": 48}, "rope_theta", "even head size"),
    ({"vocab": None}, "vocab", "LM head"),
    ({"tied_embeddings": "yes"}, "tied_embeddings", "true or false"),
    ({"input": "patches"}, "patch", "missing"),
    ({"max_positions": 4, "rope_theta": None}, "max_positions", "at least tokens"),
    ({"bias": "some"}, "bias", "must be one of"),
    ({"pool": "map"}, "pool", "bidirectional"),
    ({"seq": 8}, "seq", "unknown field"),
    ({"partials": "fp8"}, "partials", "must be one of"),
])
def test_bad_family_fields(change: dict, field: str, message: str) -> None:
    from planner.ir.models import parse_config

    table = {**_LLM, **change}
    table = {k: v for k, v in table.items() if v is not None}
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(table, "my.toml")
    assert info.value.field == field and info.value.source == "my.toml"


def test_partials_field(tmp_path: Path, micro_toml: Path) -> None:
    """`partials` reaches every MatMul; its default stays out of the attrs."""
    from planner.ir.ops.matmul import MatMul

    text = micro_toml.read_text()
    for value, attrs in (("fp32", {("partials", "fp32")}), ("fp16", set())):
        g = planner.load_model(_write(tmp_path, text + f'partials = "{value}"\n'))
        body = g.op("encoder").body  # type: ignore[attr-defined]
        mms = [op for op in (*g.ops, *body.ops) if isinstance(op, MatMul)]
        assert mms and {op.partials for op in mms} == {value}
        assert {a for a in g.attrs if a[0] == "partials"} == attrs
