"""Load pydantic configs from YAML files plus ``key.sub=value`` command-line overrides.

Errors name the file, the field's dotted path, the value given and what is allowed, e.g.::

    config error in workflows/configs/embedded.yaml:
      rollout.group_size = 0: Input should be greater than or equal to 2
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

CONFIG_DIR = Path(__file__).parent.parent / "configs"
M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that does not validate; the message says what and where."""


def resolve_config_path(name: str | Path) -> Path:
    """A path as given, or a bare name looked up in ``workflows/configs`` (``embedded``)."""
    path = Path(name)
    if path.exists():
        return path
    for candidate in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if candidate.exists():
            return candidate
    known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError(f"config file {str(name)!r} not found (bundled configs: {known})")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``trainer.optim.lr=1e-5`` → (['trainer', 'optim', 'lr'], 1e-05); values are YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form key.sub=value")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str], model: type[BaseModel] | None = None
) -> dict[str, Any]:
    """Set each dotted key in a nested dict (creating intermediate dicts).

    With ``model``, a section that the data does not give starts from that field's default
    (e.g. ``bc.trainer.zero_stage=0`` keeps the rest of ``bc.trainer``'s default, a CPU
    layout), not from an empty mapping that would validate as the class's bare defaults."""
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for i, k in enumerate(keys[:-1]):
            child = node.get(k)
            if child is None:
                child = node[k] = _default_section(model and _model_at(model, keys[:i]), k)
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {k!r} is a value, not a section")
            node = child
        node[keys[-1]] = value
    return data


def _default_section(model: Any, name: str) -> dict[str, Any]:
    """The default of field ``name`` of the config class ``model`` as a mapping ({} if it has
    none, or ``model`` is not a config class)."""
    field = getattr(model, "model_fields", {}).get(name)
    if field is None or field.is_required():
        return {}
    default = field.get_default(call_default_factory=True)
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else {}


def expand_env(data: Any) -> Any:
    """Replace ``${VAR}`` in string values by the environment's value (production files read
    model paths from HF_CKPT, ANALYZER_MODEL_PATH, GUI_ENV_SERVER_URL). Every unset variable
    is named in one ConfigError."""
    missing: list[str] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, str):
            return node

        def sub(match: re.Match[str]) -> str:
            value = os.environ.get(match.group(1))
            if value is None:
                missing.append(
                    f"  {where} = {node!r}: environment variable {match.group(1)} is not set"
                )
                return match.group(0)
            return value

        return _ENV_REF.sub(sub, node)

    out = walk(data, "")
    if missing:
        raise ConfigError("\n".join(missing))
    return out


def format_validation_error(
    exc: ValidationError, data: dict[str, Any], source: str, model: type[BaseModel] | None = None
) -> str:
    lines = [f"config error in {source}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            allowed = _fields_at(model, err["loc"][:-1]) if model else None
            hint = f"allowed here: {', '.join(allowed)}" if allowed else "check the spelling"
            lines.append(f"  {loc}: unknown field ({hint}; --print-config shows all values)")
            continue
        shown = "<missing>" if err["type"] == "missing" else repr(err.get("input"))
        lines.append(f"  {loc} = {shown}: {err['msg']}")
    return "\n".join(lines)


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's YAML mapping (empty file: {}); bad YAML or a non-mapping is a ConfigError
    naming the file."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config error in {path}: not valid YAML ({exc})") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config error in {path}: top level must be a mapping")
    return loaded


def load_config(model: type[M], path: str | Path | None = None, overrides: Sequence[str] = ()) -> M:
    """Read ``path`` (YAML mapping; may be None for all defaults), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        resolved = resolve_config_path(path)
        source = str(resolved)
        data = read_config_file(resolved)
    if overrides:
        source += " + overrides " + " ".join(overrides)
    data = expand_env(apply_overrides(data, overrides, model))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, data, source, model)) from None


def _fields_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str] | None:
    """Field names of the (nested) config model at ``loc``; None where it is not a model."""
    fields = getattr(_model_at(model, loc), "model_fields", None)
    return sorted(fields) if fields is not None else None


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> Any:
    """The annotation of the (nested) field at ``loc``: a config class, another type, or None
    where the path leaves the config classes."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return None
        current = fields[part].annotation
    return current


def config_from_cli(
    model: type[M], config: str | Path | None, overrides: Sequence[str], print_config: bool
) -> M | int:
    """A command's config, or its exit code: 2 after printing the config error (file, field,
    value, what is allowed) to stderr; 0 after printing the resolved config (--print-config)."""
    try:
        cfg = load_config(model, config, overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if print_config:
        print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        return 0
    return cfg


def dump_config(cfg: BaseModel, path: str | Path) -> Path:
    """Write the fully resolved config next to a run's outputs (reproducibility)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path
