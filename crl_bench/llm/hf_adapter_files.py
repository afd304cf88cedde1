"""Saving and loading the HF backend's trainable weights (adapters, or whole models under full
fine-tuning) for checkpoints; a mixin of :class:`crl_bench.llm.hf_backend.HFBackend`."""

from __future__ import annotations

import json
from pathlib import Path


class AdapterFiles:
    """Checkpoint I/O of the roles' weights. Relies on the backend's ``_models``, ``roles``,
    ``_route``, ``lora``, ``lock``, ``device``, ``model_name`` and ``_kv_store``."""

    def _stored_units(self) -> list[tuple[str, str, str | None]]:
        """(folder name, model key, peft adapter name) of everything trainable."""
        units: dict[str, tuple[str, str, str | None]] = {}
        for role in self.roles:
            key, name = self._route(role)
            folder = name if name is not None else key
            units[folder] = (folder, key, name)
        return list(units.values())

    def save_adapters(self, directory: str | Path) -> None:
        """Write each role's adapter to ``directory/<adapter>/`` (PEFT format) + ``roles.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self.lock:
            for folder, key, name in self._stored_units():
                model = self._models[key]
                if name is None:
                    model.save_pretrained(str(directory / folder), safe_serialization=True)
                else:
                    model.save_pretrained(str(directory), selected_adapters=[name])
        manifest = {"model_name": self.model_name, "roles": list(self.roles),
                    "routes": {r: list(self._route(r)) for r in self.roles},
                    "lora": None if self.lora is None else {
                        "r": self.lora.r, "alpha": self.lora.alpha, "dropout": self.lora.dropout,
                        "target_modules": list(self.lora.target_modules)}}
        (directory / "roles.json").write_text(json.dumps(manifest, indent=2))

    def save_adapter(self, adapter: str, directory: str | Path) -> Path:
        """Write one role's adapter in PEFT format into ``directory`` itself; return the folder."""
        import tempfile

        key, name = self._route(adapter)
        if name is None:
            raise ValueError("save_adapter needs a LoRA role; full fine-tuning saves whole models "
                             "with save_adapters().")
        directory = Path(directory)
        with self.lock, tempfile.TemporaryDirectory(dir=directory.parent if directory.parent.exists()
                                                    else None) as tmp:
            self._models[key].save_pretrained(tmp, selected_adapters=[name])
            directory.mkdir(parents=True, exist_ok=True)
            for f in (Path(tmp) / name).iterdir():
                f.replace(directory / f.name)
        return directory

    def load_adapters(self, directory: str | Path) -> None:
        """Load what :meth:`save_adapters` wrote (same roles and adapter layout)."""
        directory = Path(directory)
        self._kv_store.clear()
        manifest_path = directory / "roles.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{directory} has no roles.json; it was not written by "
                                    "save_adapters().")
        with self.lock:
            for folder, key, name in self._stored_units():
                path = directory / folder
                if not path.is_dir():
                    raise FileNotFoundError(f"{path} is missing: the saved roles do not match this "
                                            f"backend's roles {self.roles}.")
                if name is None:
                    from safetensors.torch import load_file

                    state = {}
                    for f in sorted(path.glob("*.safetensors")):
                        state.update(load_file(str(f), device=str(self.device)))
                    self._models[key].load_state_dict(state, strict=False)
                else:
                    from peft.utils import load_peft_weights, set_peft_model_state_dict

                    weights = load_peft_weights(str(path), device=str(self.device))
                    result = set_peft_model_state_dict(self._models[key], weights, adapter_name=name)
                    unexpected = getattr(result, "unexpected_keys", [])
                    if unexpected:
                        raise ValueError(f"Adapter {path} does not fit this model: unexpected "
                                         f"keys {unexpected[:5]}...")

