"""The cache from Python: manifests, prebuild (NVRTC, no GPU), stats, and the `kiln` command."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import kiln

WRITER_MANIFEST = {"archs": ["sm_90a"],
                   "policies": [{"family": "nvfp4_writer", "policy": {"op": ["pack", "append"], "page_size": 64}}]}


@pytest.fixture
def manifest(tmp_path):
    path = tmp_path / "writer.json"
    path.write_text(json.dumps(WRITER_MANIFEST))
    return path


def test_manifest_keys(manifest):
    keys = kiln.manifest_keys(manifest)
    assert len(keys) == 2 and all(k.startswith("nvfp4_writer:sm_90a:") for k in keys)
    assert {k.split(":")[2] for k in kiln.manifest_keys(manifest, archs=["sm_120a"])} == {"op=pack,page_size=64",
                                                                                        "op=append,page_size=64"}
    assert all(":sm_120a:" in k for k in kiln.manifest_keys(manifest, archs="sm_120a"))
    assert len(kiln.manifest_keys()) > 10  # the embedded default manifest


def test_manifest_keys_end_with_companions(tmp_path):
    # Two MLA keys that differ only in the mask share one combine module; two sparse head counts
    # give two merge modules. Each companion is listed once, after the manifest's own keys.
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"archs": ["sm_90a"], "policies": [
        {"family": "mla_decode", "policy": {"heads": 64, "max_seq_len": 4096, "max_seq_len_q": 2,
                                            "mask": ["dense", "causal"]}},
        {"family": "sparse_nvfp4", "policy": {"heads": [16, 32]}}]}))
    keys = kiln.manifest_keys(path)
    assert [k.split(":")[0] for k in keys] == ["mla_decode"] * 2 + ["sparse_nvfp4"] * 2 + ["mla_combine"] + ["sparse_merge"] * 2
    assert keys[4].split(":")[2] == "heads=64,max_seq_len_q=2,packed=false"
    assert [k.split(":")[2] for k in keys[5:]] == ["heads=16", "heads=32"]


def test_manifest_errors(tmp_path):
    with pytest.raises(kiln.NotFoundError, match="manifest"):
        kiln.manifest_keys(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"keys": [')
    with pytest.raises(kiln.InvalidArgumentError, match="line 1"):
        kiln.manifest_keys(bad)
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.manifest_keys(archs="sm_00")


def test_prebuild_then_hits_and_stats(manifest, cache_dir, capfd):
    first = kiln.prebuild(manifest, jobs=2, cache_dir=cache_dir)
    assert (first["compiled"], first["hits"], first["failed"], first["companions"]) == (2, 0, 0, 0)
    assert first["cache_dir"] == str(cache_dir) and first["writable"]
    assert {k["outcome"] for k in first["keys"]} == {"compiled"}
    assert capfd.readouterr().err == ""  # quiet unless asked
    second = kiln.prebuild(manifest, cache_dir=cache_dir, progress=True)
    assert (second["compiled"], second["hits"]) == (0, 2)
    lines = capfd.readouterr().err.splitlines()  # the CLI's progress lines, one per key
    assert sorted(line.split()[0] for line in lines) == ["[1/2]", "[2/2]"]
    assert all(line.split()[1] == "hit" and line.split()[2] in {k["key"] for k in first["keys"]} for line in lines)
    stats = kiln.stats(cache_dir)
    writable = [layer for layer in stats["layers"] if layer["layer"] == "writable"]
    assert writable[0]["entries"] == 2 and writable[0]["bytes"] > 0


def test_prebuild_into_a_cache_that_cannot_be_written_raises_before_compiling(manifest, tmp_path):
    not_a_dir = tmp_path / "a_file"
    not_a_dir.write_text("not a cache")
    with pytest.raises(kiln.CacheIOError, match="prebuild needs a writable cache directory") as e:
        kiln.prebuild(manifest, cache_dir=not_a_dir)
    assert e.value.path == str(not_a_dir)
    assert not_a_dir.read_text() == "not a cache"


def test_path_and_archs_arguments_of_the_wrong_type_name_the_argument(manifest, cache_dir):
    assert kiln.manifest_keys(os.fsencode(manifest)) == kiln.manifest_keys(manifest)  # bytes paths too
    assert kiln.manifest_keys(manifest, archs=("sm_90a",)) == kiln.manifest_keys(manifest, archs="sm_90a")
    assert kiln.manifest_keys(manifest, archs={"sm_90a"}) == kiln.manifest_keys(manifest, archs="sm_90a")
    with pytest.raises(TypeError, match="archs: expected"):
        kiln.manifest_keys(manifest, archs=42)
    with pytest.raises(TypeError, match="archs: expected"):
        kiln.prebuild(manifest, archs=["sm_90a", 90], cache_dir=cache_dir)
    with pytest.raises(TypeError, match="cache_dir: expected"):
        kiln.stats(cache_dir=123)
    with pytest.raises(TypeError, match="manifest: expected"):
        kiln.prebuild({"keys": []}, cache_dir=cache_dir)


def test_prebuild_skips_entries_for_other_archs(tmp_path, cache_dir):
    path = tmp_path / "sm90_only.json"
    path.write_text(json.dumps({"policies": [{"family": "nvfp4_writer", "archs": ["sm_90a"],
                                              "policy": {"op": ["pack", "append"], "page_size": 64}}]}))
    report = kiln.prebuild(path, archs="sm_120a", cache_dir=cache_dir)
    assert (report["compiled"], report["keys"], report["skipped_keys"]) == (0, [], 2)
    assert report["skipped"] == [{"entry": "policies[0]", "family": "nvfp4_writer", "archs": ["sm_90a"], "keys": 2}]
    assert kiln.manifest_keys(path, archs="sm_120a") == []


def test_cli_is_installed_with_the_package(manifest, cache_dir):
    kiln.prebuild(manifest, cache_dir=cache_dir)
    out = subprocess.run([sys.executable, "-m", "kiln", "stats", "--cache", str(cache_dir), "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == kiln.stats(cache_dir)
    script = pathlib.Path(sys.executable).parent / "kiln"
    assert script.exists(), "the `kiln` console script"
    bad = subprocess.run([str(script), "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command" in bad.stderr


def test_counters_and_seal():
    assert set(kiln.counters()) >= {"memory_hits", "disk_hits", "compiles", "loads"}
    assert not kiln.sealed()
    kiln.seal()
    try:
        assert kiln.sealed()
    finally:
        kiln.unseal()
    assert not kiln.sealed()
