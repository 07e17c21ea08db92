"""Which LoRA adapter serves a turn (lora.enabled with lora.sync=adapter).

Every user gets a slot: with lora.per_user, users in the order they first arrive, up to lora.slots (a user
beyond that is served by the base model and their turns are not trained: the `users_without_slot` counter
says how many); otherwise everyone shares slot 0. The engines hold each slot's adapter as `slotK@vN`; the
gateway routes to the newest version the trainer announced (WeightsPublished), which the trainer loads
into every engine before it announces it. The user -> slot map is kept in RUN_DIR/gateway/adapter_slots.json,
so a restarted gateway gives every user the same adapter.
"""
from __future__ import annotations

import json
import logging
from typing import Optional

from clawr1.config import Config
from clawr1.engine_api.lora import adapter_name, adapter_version, read_current
from clawr1.runtime import write_atomically

log = logging.getLogger("clawr1.gateway")


class AdapterRouting:
    def __init__(self, cfg: Config):
        lc = cfg.lora
        self.enabled = lc.serves_adapters
        self.per_user, self.slots = lc.per_user, lc.slots
        self.file = cfg.run_dir / "gateway" / "adapter_slots.json"
        self.users: dict[str, int] = self._load_users()
        current = read_current(cfg.run_dir / "adapters")
        self.version: Optional[int] = current["version"] if current else None
        self.users_without_slot: set[str] = set()

    def slot_of(self, user: str, claim: bool = True) -> Optional[int]:
        """The user's adapter slot; None: no adapter (LoRA off, an anonymous user, a user without a slot yet when
        not `claim`ing one, as an evaluation's side turn does, or every slot taken)."""
        if not self.enabled:
            return None
        if not self.per_user:
            return 0
        slot = self.users.get(user)
        if slot is None and user and claim:
            if len(self.users) >= self.slots:
                if user not in self.users_without_slot:
                    log.warning("user %r gets no adapter: all %d slots (lora.slots) are taken; serving the base model",
                                user, self.slots)
                self.users_without_slot.add(user)
                return None
            slot = self.users[user] = len(self.users)
            self._save_users()
            log.info("user %r gets adapter slot %d", user, slot)
        return slot

    def name(self, slot: Optional[int]) -> Optional[str]:
        """The engine-side adapter to send a turn of `slot` to now (None: the base, e.g. before the first publish)."""
        if slot is None or self.version is None:
            return None
        return adapter_name(slot, self.version)

    def trained_slot(self, slot: Optional[int]) -> int:
        """The slot a turn's sample trains: a user without a slot gets `lora.slots`, which the trainer drops."""
        if not self.enabled:
            return 0
        return self.slots if slot is None else slot

    def name_unchanged(self, name: str) -> bool:
        """Whether `name` is of the version routed to now (no newer one announced since it was picked)."""
        return self.version is not None and adapter_version(name) == self.version

    def published(self, version: int) -> None:
        if self.enabled and version != self.version:
            log.debug("routing to adapters of version %d", version)
            self.version = version

    def _load_users(self) -> dict[str, int]:
        if not self.file.exists():
            return {}
        try:
            users = {str(u): int(s) for u, s in json.loads(self.file.read_text()).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            log.warning("%s is unreadable: users get new adapter slots", self.file)
            return {}
        return {u: s for u, s in users.items() if 0 <= s < self.slots}

    def _save_users(self) -> None:
        write_atomically(self.file, json.dumps(self.users))

