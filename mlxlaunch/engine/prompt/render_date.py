"""The date a chat template prints, pinned, so a cached prefix does not die at midnight.

Some templates write today's date near the top of every prompt (gpt-oss' "Current date:",
Mistral's default system prompt, Llama 3.1's "Today Date:"), so the first request after
midnight shares nothing with the cached prefixes of the day before. The renderer pins the date:
once per template it checks whether the output depends on the clock, and if it does, renders
with a `strftime_now` that gives the pinned date (and `date_string`, which Llama templates read
instead). The pinned date survives restarts where the prefix cache does (a `render-date` file
next to the model's saved prefixes), so restored prefixes keep matching.

How it is passed. The installed transformers turns every callable template argument into an
inert placeholder (its sandbox rebuilds arguments from plain data), so a `strftime_now`
function given as an argument is not callable there. Instead the template text gets a leading
`strftime_now` macro (a template's own definitions take precedence over the globals) and is
passed as `chat_template`. The clock probe renders a tiny conversation with two different
pinned dates and with today's: pinning is used only where the two pinned renders differ and the
one pinned today equals the template's own render, so a template, or a tokenizer, that does not
take the macro keeps its own behaviour.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxlaunch.home import private_dir

RENDER_DATE_FILE = "render-date"
# The strftime directives the pinned `strftime_now` knows (times of day are midnight's).
DIRECTIVES = "aAbBcdHIjmMpSUwWxXyYGuVe"
# Llama 3.1 templates' `date_string` format ("26 Jul 2024").
DATE_STRING_FORMAT = "%d %b %Y"
_PERCENT = "\x00"  # stands for "%%" while the directives are replaced

# (messages, template keyword arguments) -> prompt text; raises where the template does.
TemplateCall = Callable[[list[dict[str, Any]], dict[str, Any]], str]

log = logging.getLogger(__name__)


def pinned_render_date(
    directory: Path | None, today: Callable[[], datetime.date] = datetime.date.today
) -> datetime.date:
    """The date prompts are rendered with: the one stored in `directory`'s `render-date` file
    (written with `today()` on first use), or `today()` without a directory or where the file
    cannot be read or written."""
    if directory is None:
        return today()
    path = Path(directory) / RENDER_DATE_FILE
    try:
        return datetime.date.fromisoformat(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        pass
    date = today()
    tmp = path.with_name(f".tmp-{RENDER_DATE_FILE}-{os.getpid()}")
    try:
        private_dir(directory)
        tmp.write_text(date.isoformat() + "\n", encoding="utf-8")
        os.replace(tmp, path)  # whole or not at all, for processes sharing the directory
    except OSError as exc:
        log.debug("render date not saved in %s: %s", directory, exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return date


def pinned_strftime(date: datetime.date) -> str:
    """A Jinja macro `strftime_now(format)` giving `date` at midnight, for a template's head.

    Ends with a newline that the template environment's `trim_blocks` removes, so the
    template's own first line renders as before."""
    moment = datetime.datetime.combine(date, datetime.time())
    expression = f"format.replace('%%', {json.dumps(_PERCENT)})"
    for directive in DIRECTIVES:
        value = moment.strftime(f"%{directive}")
        expression += f".replace('%{directive}', {json.dumps(value)})"
    expression += f".replace({json.dumps(_PERCENT)}, '%')"
    return f"{{% macro strftime_now(format) %}}{{{{ {expression} }}}}{{% endmacro %}}\n"


def date_arguments(template: str, date: datetime.date) -> dict[str, Any]:
    """Template keyword arguments that render `template` with `date` as today."""
    return {
        "chat_template": pinned_strftime(date) + template,
        "date_string": date.strftime(DATE_STRING_FORMAT),
    }


def clock_arguments(
    template: object, call: TemplateCall, date: datetime.date, today: datetime.date
) -> dict[str, Any]:
    """The arguments that pin `template`'s date to `date` when its output depends on the
    clock and pinning is faithful (see the module docstring); {} otherwise. `today` is the
    clock's date now."""
    if not isinstance(template, str) or "strftime_now" not in template:
        return {}
    other = today - datetime.timedelta(days=400)  # another year, month, day and weekday
    probes = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
    ]
    for messages in probes:
        try:
            own = call(messages, {})
            now = call(messages, date_arguments(template, today))
            then = call(messages, date_arguments(template, other))
        except Exception as exc:  # a template or tokenizer that refuses: leave it alone
            log.debug("chat template date not pinned: %s", exc)
            return {}
        if now != then:
            if now != own:
                log.debug("chat template date not pinned: it renders more than the date")
                return {}
            log.debug("chat template prints the date; pinned to %s", date.isoformat())
            return date_arguments(template, date)
    return {}
