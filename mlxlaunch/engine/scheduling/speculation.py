"""Which drafter a loaded model's sequences use, decided once at load (`--speculate`).

"auto" drafts with the draft model when one is given and by prompt lookup otherwise, wherever
the model allows it (caches that can be rolled back; one process, not a cluster); "lookup" and
"draft" ask for that drafter, and loading fails, with the reason, where it cannot run; "off"
never drafts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mlxlaunch.engine.cache.prefix import CacheSettings, PrefixCache, cache_settings
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.decoding.draft_model import DraftModel
from mlxlaunch.engine.decoding.drafting import speculation_unavailable
from mlxlaunch.engine.runtime.loader import LoadedModel, load_draft_model
from mlxlaunch.errors import ModelLoadError

log = logging.getLogger(__name__)

# The draft model's prefix cache, as a share of the main model's memory budget (a draft model
# is a fraction of the main model's size, and so is its KV per token).
DRAFT_CACHE_SHARE = 0.25


@dataclass(frozen=True)
class Speculation:
    """How the batch drafts: by prompt lookup (each job brings its index), or with a draft
    model (one for the whole batch), or not at all."""

    lookup: bool = False
    draft: DraftModel | None = None

    @property
    def on(self) -> bool:
        return self.lookup or self.draft is not None


OFF = Speculation()


def plan_speculation(config: EngineConfig, loaded: LoadedModel, *, cluster: bool) -> Speculation:
    """The drafter for `loaded` under `config.speculate` (loading the draft model if used).

    Raises:
        ModelLoadError: "lookup" or "draft" was asked for and cannot run (why), or the draft
            model cannot be loaded or does not share the main model's tokenizer.
    """
    mode = config.speculate
    use_draft = config.draft_model is not None and mode in ("auto", "draft")
    reason = speculation_unavailable(mode, loaded.base_model, cluster=cluster)
    if use_draft and loaded.vision is not None:  # its drafts would be blind to the images
        if mode == "draft":
            raise ModelLoadError(
                "--speculate draft is not possible here: a draft model reads no images, "
                "and this is a vision model (it drafts by prompt lookup)"
            )
        log.info("a vision model drafts by prompt lookup, not with the draft model")
        use_draft = False
    draft = None
    if reason is None and use_draft:
        assert config.draft_model is not None
        draft = load_draft_model(config.draft_model, loaded, share=config.share_weights)
        reason = speculation_unavailable(
            mode, loaded.base_model, cluster=cluster, draft=draft.model
        )
    if reason is not None:
        if mode in ("lookup", "draft"):
            raise ModelLoadError(f"--speculate {mode} is not possible here: {reason}")
        log.info("speculative decoding is off: %s", reason)
        return OFF
    if draft is None:
        log.info("speculative decoding: prompt lookup")
        return Speculation(lookup=True)
    assert config.draft_model is not None
    main = cache_settings(config)
    settings = CacheSettings(memory_bytes=int(main.memory_bytes * DRAFT_CACHE_SHARE))
    prefix = PrefixCache(draft.model, config.draft_model, settings, lambda tokens: "")
    log.info("speculative decoding: draft model %s", config.draft_model)
    return Speculation(
        draft=DraftModel(
            draft.model,
            draft.vocab_size,
            prefill_chunk=config.prefill_chunk,
            prefix=prefix if settings.memory_bytes > 0 else None,
        )
    )
