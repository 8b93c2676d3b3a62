"""Prompt rows as a run uses them: every row validated, every prompt measured against
``generator.max_prompt_length``, the ``data.overlong_prompts`` policy applied.

``load_checked_prompts(cfg, split, tokenizer)`` is the one place that policy lives: the
pre-flight check (``skyrl.config.preflight``), the training loader
(``skyrl.rollouts.sync.SyncRollouts``) and ``skyrl-eval`` all call it (or ``check_prompts``,
which it wraps), so a run drops or rejects exactly what its dry run reported.

A prompt's length is its first context as the agent loop builds it: the env's opening
messages (``skyrl.generators.agent_loop.checked_opening``: ``env.init``, which may add a
system prompt, refused unless they are messages with string role and content) rendered by
``ChatTokens.prompt_ids`` (chat template plus generation prompt), the same two calls the
loop makes. One env instance renders every row (the loop
builds one per trajectory; ``init`` is expected to depend on the row only).

Every problem is a ``ConfigError`` whose key names the file (``data.train_files[0]``) or,
for generated rows, ``data.source``, and whose message names the 1-based row.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skyrl.config.errors import ConfigError, require
from skyrl.data.generated import (
    HELD_OUT_DRAWS_PER_PROMPT,
    REASONING_GYM_EVAL_SEED_OFFSET,
    TooFewProblems,
)
from skyrl.data.prompts import PromptDataError, PromptRow, iter_prompt_file, uid_prefixes

if TYPE_CHECKING:
    from skyrl.config.root import SkyRLConfig

SPLITS = ("train", "eval")
SEED_LIMIT = 2**32
"""Seeds lie below it (numpy's ``RandomState``; ``trainer.seed`` has the same range)."""


@dataclass(frozen=True)
class SplitReport:
    """What checking one split found."""

    split: str
    """``train`` or ``eval``."""
    num_prompts: int
    """Rows kept (after the over-long policy)."""
    num_dropped: int
    """Rows dropped as longer than ``generator.max_prompt_length`` (``drop`` only)."""
    max_prompt_tokens: int
    """Longest kept prompt, in tokens (0 when none)."""


@dataclass
class PromptSplits:
    """A run's checked prompt rows, handed from the pre-flight check to the loaders."""

    train: list[PromptRow]
    eval: list[PromptRow]


def load_checked_prompts(cfg: SkyRLConfig, split: str, tokenizer) -> list[PromptRow]:
    """The ``split`` (``train`` or ``eval``) rows ``cfg.data`` names, each validated, after
    the ``data.overlong_prompts`` policy; raises ``ConfigError`` on a bad row, and on an
    over-long one under ``error``. ``tokenizer``: a transformers tokenizer with a chat
    template (the policy's)."""
    rows: list[PromptRow] = []
    check_prompts(cfg, split, tokenizer, keep=rows.append)
    return rows


def check_prompts(
    cfg: SkyRLConfig, split: str, tokenizer, keep: Callable[[PromptRow], None] | None = None
) -> SplitReport:
    """Stream ``split``'s rows through the checks, handing each kept row to ``keep`` (none:
    only count, so a large file is never held); under ``drop`` one warning line on stderr
    gives the count. Raises like ``load_checked_prompts``."""
    from skyrl.envs import make_checked_env
    from skyrl.generators.chat import ChatTokens
    from skyrl.serve.harness import is_external_agent

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if cfg.data.source == "fake":  # random token rows, no prompts
        return SplitReport(split, 0, 0, 0)
    limit, policy = cfg.generator.max_prompt_length, cfg.data.overlong_prompts
    chat = _chat_tokens(cfg, tokenizer, ChatTokens)
    env = make_checked_env(cfg.environment)
    tools = _tools(cfg, env, chat, tokenizer)
    _check_template_appends(cfg, chat, tools)
    graded_by_env = not is_external_agent(cfg.generator.agent)  # an agent grades its own rows
    total, longest, num_overlong = 0, 0, 0
    first_overlong: tuple[str, str, int] | None = None
    try:
        for key, where, row in source_rows(cfg, split):
            total += 1
            if graded_by_env:
                _check_extras(env, cfg.environment, row, key, where)
            num_tokens = _prompt_tokens(chat, env, row, key, where, tools)
            if num_tokens > limit:
                num_overlong += 1
                first_overlong = first_overlong or (key, where, num_tokens)
                continue
            longest = max(longest, num_tokens)
            if keep is not None:
                keep(row)
    finally:
        env.close()
    if first_overlong is not None and policy == "error":
        key, where, num_tokens = first_overlong
        raise ConfigError(
            key,
            f"{where}: prompt is {num_tokens} tokens (after the chat template), over "
            f"generator.max_prompt_length={limit}; {num_overlong} of {total} {split} prompts "
            "are too long (shorten them, raise generator.max_prompt_length or set "
            "data.overlong_prompts=drop)",
        )
    if num_overlong:
        print(
            f"warning: data.overlong_prompts=drop: dropped {num_overlong} of {total} {split} "
            f"prompts longer than generator.max_prompt_length={limit} tokens",
            file=sys.stderr,
            flush=True,
        )
    return SplitReport(split, total - num_overlong, num_overlong, longest)


def source_rows(cfg: SkyRLConfig, split: str) -> Iterator[tuple[str, str, PromptRow]]:
    """``(config key, where, row)`` of every row of ``split``, validated, files streamed;
    ``where`` names the file and 1-based row (``data.jsonl: row 3``) or the generated prompt
    (``arithmetic train prompt 3``)."""
    d = cfg.data
    if d.source == "files":
        files = d.train_files if split == "train" else d.eval_files
        for i, (path, prefix) in enumerate(zip(files, uid_prefixes(files), strict=True)):
            key = f"data.{split}_files[{i}]"
            try:
                for row_number, row in iter_prompt_file(path, d.prompt_key, prefix):
                    yield key, f"{path}: row {row_number}", row
                continue
            except FileNotFoundError:
                problem = f"{path}: file not found"
            except PromptDataError as exc:
                problem = str(exc)
            except OSError as exc:  # a directory, no permission, ...
                problem = f"{path}: {exc.strerror or exc}"
            raise ConfigError(key, problem)  # outside the handlers: no exception context
        return
    for i, row in enumerate(_generated_rows(cfg, split), start=1):
        yield "data.source", f"{d.source} {split} prompt {i}", row


def _generated_rows(cfg: SkyRLConfig, split: str) -> list[PromptRow]:
    d = cfg.data
    if d.source == "reasoning_gym" and not cfg.environment.dataset:
        raise ConfigError(
            "environment.dataset", "data.source=reasoning_gym needs a reasoning-gym dataset name"
        )
    if (d.num_train_prompts if split == "train" else d.num_eval_prompts) == 0:
        return []
    if d.source != "reasoning_gym":
        return _generate(cfg, split)
    _check_reasoning_gym_seed(d)
    try:
        return _generate(cfg, split)
    except ValueError as exc:  # "Dataset 'x' not registered"
        problem = f"reasoning-gym: {exc}"
    raise ConfigError("environment.dataset", problem)


def _check_reasoning_gym_seed(d) -> None:
    """Every seed reasoning-gym's generators get lies in ``[0, 2**32)``, as a numpy-seeded one
    (``pool_matrix``) requires: ``data.seed`` + i for train entry i, from ``data.seed`` +
    ``REASONING_GYM_EVAL_SEED_OFFSET`` for up to ``HELD_OUT_DRAWS_PER_PROMPT`` eval draws per
    prompt (``reasoning_gym_rows``). Otherwise its ValueError is keyed here, not on
    ``environment.dataset``."""
    eval_span = REASONING_GYM_EVAL_SEED_OFFSET + HELD_OUT_DRAWS_PER_PROMPT * d.num_eval_prompts
    span = max(d.num_train_prompts, eval_span if d.num_eval_prompts else 0)
    require(
        0 <= d.seed < SEED_LIMIT - span + 1,
        "data.seed",
        f"must be in [0, {SEED_LIMIT - span + 1}) with data.source=reasoning_gym, got {d.seed}: "
        f"its generators are seeded with data.seed up to data.seed + {span - 1}, and some "
        "(numpy's) take only 0 to 2**32 - 1",
    )


def _generate(cfg: SkyRLConfig, split: str) -> list[PromptRow]:
    """``load_prompts``; its ``TooFewProblems`` warnings printed as one line each on stderr
    naming the count's key, not as Python's two lines of skyrl source. Others pass on."""
    from skyrl.data import load_prompts

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TooFewProblems)
        rows = load_prompts(cfg.data, cfg.environment, split)
    for w in caught:
        if issubclass(w.category, TooFewProblems):
            print(f"warning: data.num_{split}_prompts: {w.message}", file=sys.stderr, flush=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return rows


def _chat_tokens(cfg: SkyRLConfig, tokenizer, chat_tokens_cls):
    """``ChatTokens`` of the tokenizer; a tokenizer without a usable chat template is the
    tokenizer key's problem."""
    try:
        return chat_tokens_cls(tokenizer)
    except Exception as exc:  # no chat template
        problem = f"the tokenizer cannot render chat prompts: {exc}"
    raise ConfigError("model.tokenizer_path" if cfg.model.tokenizer_path else "model.path", problem)


def _check_template_appends(cfg: SkyRLConfig, chat, tools) -> None:
    """With ``generator.max_turns`` > 1 the loop extends a context token for token: a chat
    template that re-renders earlier turns (Qwen3's) is refused here, the ``ConfigError`` on
    ``generator.max_turns`` the loop would raise at the first observation of step 1. Any
    other error of the probe is left to the loop (an env's observations may take another
    role than the probe's ``user``)."""
    from skyrl.generators.chat import NotAppendOnly

    if cfg.generator.max_turns <= 1:
        return
    try:
        chat.observation_ids([{"role": "user", "content": "probe"}], True, tools)
    except NotAppendOnly:
        raise
    except Exception:  # the template refuses the probe's role: the loop's own call decides
        return


def _tools(cfg: SkyRLConfig, env, chat, tokenizer) -> list | None:
    """The tools the agent loop will declare for this env (``declared_tools``); an env that
    needs native tools the template cannot render is the environment's problem, as is one
    whose ``tool_schemas`` or ``use_native_tools`` raises (a user env's own code)."""
    from skyrl.generators.tool_calls import ToolCallParser, declared_tools

    key = "environment._target_" if cfg.environment._target_ else "environment.tool_format"
    try:
        return declared_tools(env, chat, ToolCallParser(tokenizer, cfg.generator.tool_parser))
    except ValueError as exc:
        problem = str(exc)
    except Exception as exc:  # the exception context is kept
        why = f"{type(exc).__name__}: {exc}"
        raise ConfigError(key, f"declaring the env's tools failed: {why}") from exc
    raise ConfigError(key, problem)


def _check_extras(env, env_cfg, row: PromptRow, key: str, where: str) -> None:
    """``row`` carries every field the env reads (``TextEnv.required_extras``), not null, not
    NaN (``json.dumps`` writes a missing float as ``NaN``; nothing grades equal to it) and not
    an empty or blank string (the math grader scores an empty final answer 1 against it).
    Not checked for an external agent (``generator.agent``), which grades its rows itself:
    the env never runs."""
    for name in getattr(env, "required_extras", ()):
        label = env_cfg._target_ or env_cfg.name
        problem = _extra_problem(name, row.extras.get(name))
        require(
            problem is None,
            key,
            f"{where}: {problem} (environment {label!r} grades against it)",
        )


def _extra_problem(name: str, value) -> str | None:
    """Why ``value`` cannot be graded against (None: it can)."""
    if value is None:
        return f"no {name!r}"
    if isinstance(value, float) and math.isnan(value):
        return f"{name!r} is NaN"
    if isinstance(value, str) and not value.strip():
        return f"{name!r} is empty" if not value else f"{name!r} is blank ({value!r})"
    if isinstance(value, list | tuple | dict) and not value:
        return f"{name!r} is empty ({value!r})"
    return None


def _prompt_tokens(chat, env, row: PromptRow, key: str, where: str, tools=None) -> int:
    """Tokens of ``row``'s first context, rendered by the agent loop's own calls."""
    from skyrl.generators.agent_loop import BadEnvResult, checked_opening

    problem = None
    try:
        messages = checked_opening(env, row)
    except BadEnvResult as exc:  # the loop would end every trajectory of the row (env_error)
        problem = f"{where}: env.init returned unusable messages: {exc}"
    except Exception as exc:  # a user env's init; the exception context is kept
        raise ConfigError(key, f"{where}: env.init failed: {type(exc).__name__}: {exc}") from exc
    if problem is not None:
        raise ConfigError(key, problem)  # outside the handler: no exception context
    try:
        return len(chat.prompt_ids(messages, tools))
    except Exception as exc:  # e.g. a template that requires alternating roles
        raise ConfigError(
            key, f"{where}: the chat template cannot render it: {type(exc).__name__}: {exc}"
        ) from exc
