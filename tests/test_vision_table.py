"""The image table of a vision model (runtime/vision.py): images known by their run's ids,
held while a request holds them, and the recent ones kept within a byte budget; the runs'
ids come from the images' bytes, and the rotary shift of a prompt from the runs it holds."""

from __future__ import annotations

import gc
import hashlib

import numpy as np

from mlxlaunch.engine.runtime.vision import (
    IMAGE_ID_BASE,
    ImageTable,
    PreparedImage,
    image_first_id,
    text_only,
)


def image(data: bytes, rows: int = 2, columns: int = 3, nbytes: int = 1000) -> PreparedImage:
    digest = hashlib.sha256(data).digest()
    return PreparedImage(
        digest=digest,
        first_id=image_first_id(digest),
        rows=rows,
        columns=columns,
        pixel_values=np.zeros(nbytes, dtype=np.uint8),
        grid_thw=(1, rows * 2, columns * 2),
    )


def test_ids_come_from_the_bytes() -> None:
    a, again, other = (
        image(b"a"),
        image(b"a"),
        image(b"a."),
    )
    assert a.ids == again.ids and a.ids[0] >= IMAGE_ID_BASE
    assert not set(a.ids) & set(other.ids)
    assert a.ids[-1] < 2**31  # int32, as token arrays hold them


def test_a_run_is_found_and_shifts_what_follows() -> None:
    table = ImageTable()
    a = table.add(image(b"a"))  # 2x3: 6 tokens, positions advance by max(2, 3) = 3
    assert table.find(a.ids[4]) == (a, 4)
    assert table.find(5) is None and table.find(a.ids[-1] + 1) is None
    assert a.shift == 3 - 6
    prompt = [1, 2, *a.ids, 3]
    assert table.shift_of(prompt) == -3
    assert table.shift_of(prompt[:4]) == 0  # the run is not over yet
    assert text_only([7, 8, a.ids[0], 9]) == [7, 8]


def test_held_images_stay_and_the_recent_ones_within_the_budget() -> None:
    table = ImageTable(kept_bytes=2500)
    held = table.add(image(b"held"))
    for n in range(5):
        table.add(image(bytes([n])))
    gc.collect()
    assert table.find(held.ids[0]) == (held, 0)  # this test holds it
    recent = [image(bytes([n])) for n in range(5)]
    known = [table.find(r.ids[0]) is not None for r in recent]
    assert known == [False, False, False, True, True]  # the last two (1000 bytes each) fit in 2500
