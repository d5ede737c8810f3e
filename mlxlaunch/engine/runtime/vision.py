"""Vision models through mlx-vlm: its model and processor, the language part driving the engine.

An image becomes a run of token ids derived from its bytes (`image_first_id`), so the prefix
cache and the disk tier, which key KV by token ids, tell images apart by content; the prefill
embeds those ids with the vision tower's features, everything else with the text embedding.

Design notes:
- Qwen2-VL / Qwen2.5-VL place image tokens with 3-D rotary positions (time, height, width):
  mlx-vlm's `get_rope_index`. The run's positions start where its first token would stand, and
  the text after it continues at `start + max(rows, columns)`; each image thus shifts every
  later position by `max(rows, columns) - tokens`. The batch keeps each sequence's shift and
  sets the rows' shifts (`RowPositions`) before every forward pass, so text requests (shift 0)
  and image requests prefill and decode in one batch.
- The vision tower runs once per image, in the first prefill chunk that holds any of its
  tokens (a chunk may end inside the run: each id says its place in it). A request holds its
  prepared images while it runs; the table keeps recent ones within a byte budget.
- Every reach into mlx-vlm's model (`language_model.model.embed_tokens`, `vision_tower`, the
  language model's `position_ids`) is here, checked against mlx-vlm's own forward pass by
  tests/test_vision_engine.py.
- Families: the Qwen VL ones (`qwen2_vl`, `qwen2_5_vl`); other mlx-vlm families are served
  text-only through mlx-lm for now.
- Measured on tiny-vision (CPU): a 64-token image's first token 50-120 ms cold, 6 ms with
  its KV cached. Qwen2.5-VL's processor: ~1,280 image tokens per megapixel (28-pixel merged
  patches), at most 16,384 (its max_pixels, 12.8 MP).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxlaunch.engine.types import ImageInput, InvalidRequest, PromptTooLong

# Token ids of image runs: above every vocabulary (the largest are ~260k), below int32's end.
IMAGE_ID_BASE = 1 << 30
_ID_SPACE = 1 << 29  # where a run may start, so that base + start + tokens stays an int32
Rendered = TypeVar("Rendered")
VISION_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
# Recent images kept beyond the requests that hold them (pixels, features once computed):
# a 16k-token Qwen2.5-VL image's pixels take ~300 MB, so the bound is in bytes.
IMAGES_KEPT_BYTES = 1 << 30


def is_vision_config(config: dict[str, Any]) -> bool:
    """Whether `config` (a config.json) is a vision model this engine serves with its tower."""
    return config.get("model_type") in VISION_FAMILIES and "vision_config" in config


@dataclass
class PreparedImage:
    """One image, preprocessed by the model's processor: its id run, pixels and grid."""

    digest: bytes
    first_id: int
    rows: int  # merged patches (tokens) down and across
    columns: int
    pixel_values: np.ndarray | None  # dropped once the tower's features are computed
    grid_thw: tuple[int, int, int]
    features: mx.array | None = field(default=None, repr=False)  # the tower's, once run

    @property
    def nbytes(self) -> int:
        pixels = self.pixel_values.nbytes if self.pixel_values is not None else 0
        return pixels + (self.features.nbytes if self.features is not None else 0)

    @property
    def tokens(self) -> int:
        return self.rows * self.columns

    @property
    def ids(self) -> list[int]:
        return list(range(self.first_id, self.first_id + self.tokens))

    @property
    def shift(self) -> int:
        """How much this image moves the rotary position of every token after it."""
        return max(self.rows, self.columns) - self.tokens


def image_first_id(digest: bytes) -> int:
    """The first token id of the run of the image whose sha256 is `digest`."""
    return IMAGE_ID_BASE + int.from_bytes(digest[:8], "big") % _ID_SPACE


class ImageTable:
    """The images the engine knows, by the token ids of their runs (thread-safe).

    An image is known while a request holds it (its job keeps the `PreparedImage`), and the
    most recent ones up to `kept_bytes` beyond that (a next turn that repeats them)."""

    def __init__(self, kept_bytes: int = IMAGES_KEPT_BYTES) -> None:
        self._images: weakref.WeakValueDictionary[int, PreparedImage] = (
            weakref.WeakValueDictionary()
        )
        self._recent: OrderedDict[int, PreparedImage] = OrderedDict()
        self._starts: list[int] = []
        self._kept_bytes = kept_bytes
        self._lock = threading.Lock()

    def add(self, image: PreparedImage) -> PreparedImage:
        """Keep `image` (or the one already kept with its bytes)."""
        with self._lock:
            known = self._images.get(image.first_id)
            if known is not None and known.digest == image.digest:
                image = known
            self._images[image.first_id] = image
            self._recent[image.first_id] = image
            self._recent.move_to_end(image.first_id)
            while len(self._recent) > 1 and self._recent_bytes() > self._kept_bytes:
                self._recent.popitem(last=False)
            self._starts = sorted(self._images.keys())
            return image

    def _recent_bytes(self) -> int:
        return sum(image.nbytes for image in self._recent.values())

    def find(self, token: int) -> tuple[PreparedImage, int] | None:
        """The image whose run holds `token`, and the token's index in it."""
        if token < IMAGE_ID_BASE:
            return None
        with self._lock:
            starts = self._starts
            at = int(np.searchsorted(starts, token, side="right")) - 1
            if at < 0:
                return None
            image = self._images.get(starts[at])  # None: no request holds it any more
        if image is None:
            return None
        index = token - image.first_id
        return (image, index) if index < image.tokens else None

    def shift_of(self, tokens: Sequence[int]) -> int:
        """The rotary shift after `tokens` (the images whose runs end in them)."""
        shift = 0
        for token in tokens:
            if token >= IMAGE_ID_BASE and (found := self.find(token)) is not None:
                image, index = found
                if index == image.tokens - 1:
                    shift += image.shift
        return shift


class VisionLanguageModel(nn.Module):
    """mlx-vlm's model behind mlx-lm's calling convention: `model(ids, cache=…) -> logits`.

    Ids at or above `IMAGE_ID_BASE` are image tokens, embedded with their image's features;
    `positions` holds each batch row's rotary shift, set by the batch before a forward pass.
    """

    def __init__(self, vlm: nn.Module, processor: Any) -> None:
        super().__init__()
        self.vlm = vlm
        self._processor = processor
        self._table = ImageTable()
        self._positions = RowPositions()
        config = vlm.config
        self._image_token_id = int(config.image_token_id)
        self._merge = int(config.vision_config.spatial_merge_size)

    # --- what the rest of the engine reads ---------------------------------------------------

    @property
    def layers(self) -> Any:
        return self.vlm.language_model.model.layers

    @property
    def args(self) -> Any:
        return self.vlm.language_model.args

    @property
    def image_token_id(self) -> int:
        return self._image_token_id

    @property
    def table(self) -> ImageTable:
        return self._table

    @property
    def positions(self) -> RowPositions:
        return self._positions

    # --- images ------------------------------------------------------------------------------

    def prepare(self, data: bytes) -> PreparedImage:
        """Preprocess an image's encoded bytes (PNG, JPEG, …) with the model's processor.

        Raises:
            ValueError: the bytes are not an image the imaging library reads.
        """
        from PIL import Image

        digest = hashlib.sha256(data).digest()
        first = image_first_id(digest)
        if (known := self._table.find(first)) is not None and known[0].digest == digest:
            return known[0]
        try:
            picture = Image.open(io.BytesIO(data)).convert("RGB")
        except Exception as exc:  # PIL raises several kinds for a broken file
            raise ValueError(f"the image cannot be read ({exc})") from exc
        out = self._processor.image_processor(images=[picture], return_tensors="np")
        grid = tuple(int(v) for v in np.asarray(out["image_grid_thw"])[0])
        t, h, w = grid
        if t != 1:
            raise ValueError("an image with more than one frame")
        image = PreparedImage(
            digest=digest,
            first_id=first,
            rows=h // self._merge,
            columns=w // self._merge,
            pixel_values=np.asarray(out["pixel_values"]),
            grid_thw=(t, h, w),
        )
        return self._table.add(image)

    def expand(self, tokens: Sequence[int], images: Sequence[PreparedImage]) -> list[int]:
        """`tokens` with the i-th image token widened to the run of `images[i]`.

        Raises:
            ValueError: the prompt holds another number of image tokens than images.
        """
        pad = self._image_token_id
        places = [i for i, t in enumerate(tokens) if t == pad]
        if len(places) != len(images):
            raise ValueError(
                f"the chat template placed {len(places)} image(s) for the {len(images)} sent"
            )
        out: list[int] = []
        last = 0
        for place, image in zip(places, images, strict=True):
            out += tokens[last:place]
            out += image.ids
            last = place + 1
        out += tokens[last:]
        return out

    def collapse(self, tokens: Sequence[int]) -> list[int]:
        """`tokens` with each image's run narrowed back to the one image token the chat
        template writes (what `expand` widened)."""
        out: list[int] = []
        previous = 0
        for token in tokens:
            if token < IMAGE_ID_BASE:
                out.append(token)
            elif previous < IMAGE_ID_BASE:  # a run's first id (templates part images)
                out.append(self._image_token_id)
            previous = token
        return out

    # --- the forward pass --------------------------------------------------------------------

    def __call__(self, inputs: mx.array, cache: Any = None, **_: Any) -> mx.array:
        language = self.vlm.language_model
        batch, length = inputs.shape
        offsets = _offsets(cache, batch)
        shifts = self._positions.take(batch)
        # An image's ids as the image token (a drafted one is never accepted anyway).
        text_ids = mx.where(inputs >= IMAGE_ID_BASE, self._image_token_id, inputs)
        if self._positions.prefill:
            embeds, positions = self._prefill_inputs(inputs, text_ids, offsets, shifts)
        else:  # decoding: text only, and lazy (the inputs may be the last pass's samples)
            embeds = language.model.embed_tokens(text_ids)
            flat = offsets[:, None] + mx.arange(length)[None, :] + mx.array(shifts)[:, None]
            positions = mx.broadcast_to(flat[None], (3, batch, length))
        out = language(text_ids, inputs_embeds=embeds, cache=cache, position_ids=positions)
        return out.logits

    def _prefill_inputs(
        self, inputs: mx.array, text_ids: mx.array, offsets: mx.array, shifts: list[int]
    ) -> tuple[mx.array, mx.array]:
        """The embeddings and 3-D positions of a prefill chunk (its ids are concrete)."""
        ids = np.array(inputs).astype(np.int64)
        starts = np.array(offsets).astype(np.int64)
        batch, length = ids.shape
        positions = np.zeros((3, batch, length), dtype=np.int64)
        feature_index = np.zeros((batch, length), dtype=np.int64)  # 0: the text embedding
        features: list[mx.array] = []
        placed: dict[bytes, int] = {}  # image digest -> where its features start (+1)
        for row in range(batch):
            shift = shifts[row]
            for col in range(length):
                token = int(ids[row, col])
                at = int(starts[row]) + col
                found = self._table.find(token) if token >= IMAGE_ID_BASE else None
                if found is None:
                    positions[:, row, col] = at + shift
                    continue
                image, index = found
                start = at - index + shift
                positions[0, row, col] = start
                positions[1, row, col] = start + index // image.columns
                positions[2, row, col] = start + index % image.columns
                if image.digest not in placed:
                    placed[image.digest] = 1 + sum(int(f.shape[0]) for f in features)
                    features.append(self._features(image))
                feature_index[row, col] = placed[image.digest] + index
                if index == image.tokens - 1:
                    shift += image.shift
            shifts[row] = shift
        self._positions.set(shifts, prefill=True)  # a later chunk of this call continues here
        embeds = self.vlm.language_model.model.embed_tokens(text_ids)
        if features:
            width = embeds.shape[-1]
            rows = mx.concatenate([mx.zeros((1, width), embeds.dtype), *features])
            where = mx.array(feature_index)
            override = rows[where].astype(embeds.dtype)
            embeds = mx.where(mx.expand_dims(where > 0, -1), override, embeds)
        return embeds, mx.array(positions)

    def _features(self, image: PreparedImage) -> mx.array:
        if image.features is None:
            assert image.pixel_values is not None
            tower = self.vlm.vision_tower
            pixels = mx.array(image.pixel_values).astype(tower.patch_embed.proj.weight.dtype)
            features = tower(pixels, mx.array([image.grid_thw]), output_hidden_states=False)
            mx.eval(features)
            image.features, image.pixel_values = features, None
        return image.features


@dataclass
class RowPositions:
    """Each batch row's rotary shift for the next forward pass, and whether it prefills."""

    shifts: list[int] = field(default_factory=list)
    prefill: bool = False

    def set(self, shifts: Sequence[int], *, prefill: bool) -> None:
        self.shifts = list(shifts)
        self.prefill = prefill

    def take(self, batch: int) -> list[int]:
        return list(self.shifts) if len(self.shifts) == batch else [0] * batch


def _offsets(cache: Any, batch: int) -> mx.array:
    """Each row's position of its first input token: the first layer's cache offset."""
    offset = getattr(cache[0], "offset", 0) if cache else 0
    if isinstance(offset, mx.array):
        return offset.reshape(-1)[:batch] if offset.size > 1 else mx.full((batch,), offset.item())
    return mx.full((batch,), int(offset))


def render_with_images(
    render: Callable[[], Rendered],
    vision: VisionLanguageModel,
    images: Sequence[ImageInput],
    limit: int | None,
    exact: bool,
) -> Rendered:
    """`render()`'s prompt (a `prompt.render.RenderedPrompt`) with its image tokens widened
    to the runs of `images` (each preprocessed by the model's processor), checked against
    the window `limit` again.

    Raises:
        InvalidRequest: an image that cannot be read, or not placed by the template.
        PromptTooLong: the widened prompt does not fit (unless `exact`).
    """
    rendered = render()
    try:
        prepared = [vision.prepare(image.data) for image in images]
        tokens = vision.expand(rendered.tokens, prepared)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    if limit is not None and not exact and len(tokens) >= limit:
        raise PromptTooLong(len(tokens), limit)
    # The prompt holds its images while it lives (the table keeps only what is held).
    return dataclasses.replace(rendered, tokens=tokens, images=tuple(prepared))  # type: ignore[type-var]


def text_only(tokens: list[int]) -> list[int]:
    """`tokens` up to the first image id (drafts copied from a prompt that holds images)."""
    for i, token in enumerate(tokens):
        if token >= IMAGE_ID_BASE:
            return tokens[:i]
    return tokens


def set_row_shifts(model: Any, shifts: Sequence[int], *, prefill: bool) -> None:
    """Tell a vision model each row's shift before a forward pass (others need nothing)."""
    if isinstance(model, VisionLanguageModel):
        model.positions.set(shifts, prefill=prefill)


def load_vision(path: Path) -> tuple[VisionLanguageModel, dict[str, Any]]:
    """mlx-vlm's model and processor at `path`, wrapped; and its config.

    Raises:
        ImportError: mlx-vlm is not installed (the `vision` extra).
    """
    from mlx_vlm.utils import load as mlx_vlm_load
    from mlx_vlm.utils import load_config

    vlm, processor = mlx_vlm_load(str(path))
    return VisionLanguageModel(vlm, processor), load_config(path)
