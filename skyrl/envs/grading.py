"""Answer extraction and grading shared by the built-in envs.

Three deliberate departures from letting math-verify decide everything:

- A gold that is a plain number (GSM8K, the arithmetic task) accepts only a plain number (or
  a percent of one, read as a percent sign is below), compared exactly. math-verify evaluates
  what it is given, so ``#### 23 + 5``, ``#### 56/2`` or ``#### 1 = 28`` (it reads an
  equation as its right-hand side) would match 28, and a policy would learn to copy the
  question instead of solving it.
- Any other gold goes to math-verify, but first the answer is parsed without evaluation,
  and one that could build a huge number (``9^{9^{9}}``, ``1000000!``, the root of a large
  number) or expansion (``(x+1)^{999}``), or that holds calculus or a matrix function,
  scores 0 unevaluated. Off the main thread math-verify has no timeout, and big-integer
  arithmetic runs in C calls that hold the GIL, so the caller's own time limit could never
  fire. The bounds are on numbers and terms, not on every sympy algorithm: an answer within
  them can still take ~1 s of simplification (Python code, which lets that limit fire).
- A gold that is a word or phrase (letters and spaces with a run of two letters: ``yes``,
  ``\\text{even}``, ``no solution``) accepts only the same words, ignoring case, ``\\text{}``
  and a trailing ``.``. math-verify reads bare letters as a product of variables and
  ``e``, ``i``, ``pi`` as constants, so ``sey`` matched ``yes`` and ``on`` matched ``no``,
  while ``true`` missed ``\\text{true}``. A product written as bare letters (``xy``) is then
  read as a word too: ``yx`` does not match it.

Where math-verify would grade a correct answer 0 or a wrong one 1, the text is read first:

- Decimals are exact numbers. math-verify rounds both sides to 6 decimals once one side is a
  float, so ``0.5000001`` matched ``\\frac{1}{2}``; each decimal is rewritten as the fraction
  it is (``0.125`` as ``\\frac{125}{1000}``), on both sides, so numbers compare exactly, in
  tuples, intervals and matrices too. One exception: an answer that is a single decimal
  matches an irrational gold (``\\sqrt{2}``, ``\\pi``) within a relative ``1e-9``
  (``1.4142135624``; not ``1.414214``). A decimal after a thousands separator (``1,000.5``)
  is left to math-verify.
- Units count when both sides have one. math-verify drops a trailing ``\\text{..}`` unit, so
  ``5\\text{ m}`` matched ``5\\text{ cm}``. A trailing ``\\text``/``\\mbox``/``\\mathrm``
  unit (with ``^2``/``^3``) or ``^\\circ`` on both sides must be the same unit: case,
  spaces, plurals and common abbreviations aside (``cm`` is ``centimeters``, ``ft`` is
  ``feet``, ``square units`` is ``units^2``); a spelling outside those is another unit. A
  bare number still matches a gold with a unit, and an answer with a unit a gold without
  one that is not a plain number (``5\\text{ cm}`` matches ``\\frac{10}{2}``; against ``5``
  it is no plain number, as the first rule says).
- An inequality matches the intervals it describes (``x<3`` is ``(-\\infty,3)``), unless the
  gold is an open pair of finite numbers (``(1,3)``), which may be a point.
- An answer in E-notation (``1.0e-3``, ``2E5``) is that number (math-verify read ``e`` as
  Euler's number), unless the gold holds Euler's number. A plain-number gold still takes
  only a plain number.
- A percent sign on one side is read both ways: its number, as math-verify reads it (the sign
  left out), and its value over 100. A percent gold (``10\\%``) takes ``10``, ``0.1`` and
  ``\\frac{1}{10}``; a percent answer (``15\\%``) matches a gold ``15``, ``0.15`` or
  ``\\frac{3}{20}``, a plain-number gold included. With a sign on both sides, the numbers
  before the signs compare (``0.1\\%`` is not ``10\\%``).
- A repeating decimal (``0.1\\overline{6}``, ``0.\\bar{3}``) is the fraction it is
  (``\\frac{15}{90}``, ``\\frac{3}{9}``); math-verify read it as a product with a symbol.
"""

from __future__ import annotations

import math
import numbers
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import TypeGuard

_HASH = re.compile(r"(?<!#)####(#*)\s*([^\n]+)")
_HEADING = re.compile(r"[A-Z][a-z]+(?![A-Za-z])")
"""How a markdown heading after ``####`` starts (``Final Answer``, ``Step 1: add``,
``Explanation``), unlike an answer (``42``, ``\\frac{1}{2}``, ``x = 3``, ``(1,2)``)."""
_BRACE = re.compile(r"\\boxed\{|[{}]")
_BOLD = re.compile(r"\*\*((?:(?!\*\*).)+)\*\*", re.DOTALL)
_THOUSANDS_COMMA = re.compile(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))")
_BRACKETED = re.compile(r"[(\[]|\\\{|\\langle")
"""What opens a tuple, interval, set or vector (``(100,200)``, ``[0,100]``, ``\\{1,500\\}``),
whose commas separate its items: not thousands separators."""
_GROUPED_NUMBER = re.compile(r"[+-]?\s*[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?")
_PLAIN_NUMBER = re.compile(r"[+-]?\s*(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
"""A signed integer or decimal; a space may follow the sign (``- 5``, as LaTeX renders ``-5``)."""
_MATH_DELIMITED = re.compile(r"\s*(?:\\\((.*)\\\)|\\\[(.*)\\\])\s*", re.DOTALL)
"""A text in LaTeX's inline or display math delimiters, ``\\(..\\)`` or ``\\[..\\]``."""
_LATEX_THOUSANDS = ("{,}", ",\\!", "\\,")
"""How LaTeX writes a thousands separator (MATH's answers use ``10,\\!000``); read as ``,``."""
_WRAPPER = re.compile(r"\\(?:boxed|text|textbf|mathrm|mathbf)\{(.*)\}", re.DOTALL)
_WORDS = re.compile(r"(?=.*[a-z]{2})[a-z]+(?: [a-z]+)*")
"""A word or phrase, lowercased (``no solution``); not single letters (``x y``, a choice ``a``)."""

MAX_ANSWER_CHARS = 300
"""A longer answer to a non-numeric gold scores 0 unparsed: not read for a unit either, whose
pattern takes time quadratic in a ``\\text{`` left open (a 60,000-character answer held the GIL
for 30 s, stalling every thread of the process: the env's time limit could not fire)."""
MAX_EXACT_BITS = 4096
"""Bound on the bits of all exact numbers grading may build, together. sympy tests integers
for primality (in ``log(n)``) and takes roots of them (``\\sqrt{n}``), both ~cubic in the
bits; a primality test's modular powers are C calls that hold the GIL. At 4096 bits that
costs ~0.3 s, at 16384 bits 15 s."""
MAX_TERMS = 64
"""Bound on the terms of an expansion (``(\\sin x+\\cos x)^{63}``, ``\\tan(x)^{63}``: ~1 s)."""
_SYMPY_LOCK = threading.Lock()
"""Held while grading builds sympy expressions. sympy's cache is shared between threads, so
another grader could otherwise pick up the unevaluated ones of :func:`_too_costly`. Grading
holds the GIL anyway, so serialising it costs no throughput."""
_COMPUTED_WHILE_PARSING = re.compile(r"\\(?:det|gcd|lcm|operatorname)(?![a-zA-Z])|vmatrix")
"""What math-verify's LaTeX parser computes at once: determinants, gcds, matrix functions."""
_DECIMAL = re.compile(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])")
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\(?:overline|bar)\s*\{(\d+)\}")
"""A repeating decimal: its whole part, the places that do not repeat, and those that do."""
_AFTER_THOUSANDS = re.compile(r"\d(?:,|\{,\}|,\\!|\\,)$")
_E_NOTATION = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))[eE]([+-]?\d+)")
_PERCENT = re.compile(r"(.*[^\s\\])\s*\\?%")
_UNIT = re.compile(
    r"(?P<quantity>.*\S)\s*(?:\\(?:text|textrm|textnormal|mbox|mathrm)\s*"
    r"\{(?P<unit>[^{}]*[a-zA-Z][^{}]*)\}(?:\^\{?(?P<power>[23])\}?)?"
    r"|(?P<degree>\^\s*\{?\\circ\}?|\u00b0))\s*\.?"
)
_UNIT_NAMES = {
    **dict.fromkeys(["mm", "millimetre"], "millimeter"),
    **dict.fromkeys(["cm", "centimetre"], "centimeter"),
    **dict.fromkeys(["m", "metre"], "meter"),
    **dict.fromkeys(["km", "kilometre"], "kilometer"),
    **dict.fromkeys(["in"], "inch"),
    **dict.fromkeys(["ft", "feet"], "foot"),
    **dict.fromkeys(["yd"], "yard"),
    **dict.fromkeys(["mi"], "mile"),
    **dict.fromkeys(["s", "sec"], "second"),
    **dict.fromkeys(["min"], "minute"),
    **dict.fromkeys(["h", "hr"], "hour"),
    **dict.fromkeys(["g"], "gram"),
    **dict.fromkeys(["kg"], "kilogram"),
    **dict.fromkeys(["lb"], "pound"),
    **dict.fromkeys(["oz"], "ounce"),
    **dict.fromkeys(["l", "litre"], "liter"),
    **dict.fromkeys(["ml", "millilitre"], "milliliter"),
    **dict.fromkeys(["deg"], "degree"),
}
"""Common abbreviations and spellings of a unit (singular), to one name."""
RELATIVE_TOLERANCE = Decimal("1e-9")
"""How close a single decimal answer must be to an irrational gold, relative to the gold."""


def _boxes(text: str) -> list[tuple[int, str]]:
    """Where each closed ``\\boxed{..}`` starts, and its content (braces balanced), read in
    one pass: a reply of many unclosed boxes is not rescanned from each."""
    found: list[tuple[int, str]] = []
    # per open brace: (the start of its \boxed, or -1 for a plain brace; its content's start)
    open_braces: list[tuple[int, int]] = []
    for match in _BRACE.finditer(text):
        if match.group() == "}":
            if open_braces:
                box_start, content_start = open_braces.pop()
                if box_start >= 0:
                    found.append((box_start, text[content_start : match.start()]))
        elif match.group() == "{":
            open_braces.append((-1, match.end()))
        else:
            open_braces.append((match.start(), match.end()))
    return found


def last_answer_tag(text: str) -> str | None:
    """The content of the last ``<answer>..</answer>`` (each tag closed by the next close), if
    any. Read in one pass: a reply of many unclosed tags is not rescanned from each, as a
    regular expression's search would."""
    content, start = None, text.find("<answer>")
    while start != -1:
        end = text.find("</answer>", start + len("<answer>"))
        if end == -1:
            break
        content = text[start + len("<answer>") : end]
        start = text.find("<answer>", end + len("</answer>"))
    return content


def _unbold(text: str) -> str:
    """``text`` without markdown bold around all of it (``**42**`` is ``42``)."""
    match = _BOLD.fullmatch(text.strip())
    return match.group(1).strip() if match else text.strip()


def extract_answer(text: str) -> str | None:
    """The final answer: the last ``<answer>..</answer>``, else the last answer marker.

    The answer markers are ``#### x`` (GSM8K) and ``\\boxed{x}``; whichever comes last
    wins, so ``#### 42`` then ``\\boxed{41}`` answers 41 (a model that boxes after the
    ``####`` line has revised its answer). A ``####`` line that reads as a markdown heading
    (it starts with a capitalised word: ``#### Final Answer``, ``#### Explanation``) or has
    more than four ``#`` is not a marker while another marker exists, so a heading before
    or after the answer does not replace it; with no other marker it is still the answer,
    as before. Markdown bold around an answer (``**42**``, or around its marker line:
    ``**#### 42**``) is dropped, and after ``####`` a trailing ``.`` and thousands separators
    (``1,234``) too, but not the commas of a tuple, interval or set (``#### [0,100]`` stays
    ``[0,100]``, see ``_BRACKETED``). An answer tag
    that holds a marker answers with that marker (``<answer>2 + 5 = 7\\n#### 7</answer>`` is
    ``7``, as without the tag; a prompt that asks for ``####`` and a tools env that asks for
    the tag get both).
    """
    tag = last_answer_tag(text)
    if tag is not None:
        markers, _ = _markers(tag)  # a heading inside the tag is no answer
        return _last(markers) if markers else _unbold(tag)
    markers, headings = _markers(text)
    return _last(markers or headings)


def _markers(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(markers, headings)`` of ``text`` as ``(start, answer)``: its boxes and ``####``
    answers, and its ``####`` lines that read as markdown headings (``extract_answer``)."""
    markers = [(start, _unbold(content)) for start, content in _boxes(text)]
    headings: list[tuple[int, str]] = []
    for match in _HASH.finditer(text):
        answer = match.group(2).strip().rstrip(".")
        if answer.endswith("**") and answer.count("**") % 2:  # a bold opened before the ####
            answer = answer.removesuffix("**").strip().rstrip(".")
        answer = _unbold(answer).rstrip(".")
        if not _BRACKETED.search(answer):
            answer = _THOUSANDS_COMMA.sub("", answer)
        is_heading = match.group(1) or _HEADING.match(answer)
        (headings if is_heading else markers).append((match.start(), answer))
    return markers, headings


def _last(markers: list[tuple[int, str]]) -> str | None:
    """The answer of the marker that starts last, if any."""
    return max(markers, key=lambda marker: marker[0])[1] if markers else None


def plain_number(text: str) -> Decimal | None:
    """The value of an integer or decimal such as ``-3``, ``2.50``, ``$1,000.``, ``\\boxed{28}``.

    ``$`` and math delimiters around it (``\\(28\\)``, ``\\[28\\]``), thousands separators
    (``1,000``, and LaTeX's ``1{,}000``, ``1,\\!000``, ``1\\,000``: between groups of three
    digits only), a trailing ``.``, ``\\boxed{}``/``\\text{}``/``\\mathbf{}`` wrappers,
    braces around a number (a LaTeX group: ``\\boxed{{-3}}`` is ``-3``), parentheses around
    one without separators (``(-3)``; ``(1,000)`` may be a pair) and a space after its sign
    (``- 5``) are ignored; anything else (an operator, a unit, a fraction, an exponent) gives
    ``None``.
    """
    s = _unmath(text).replace("\u2212", "-")
    for separator in _LATEX_THOUSANDS:
        s = s.replace(separator, ",")
    s = s.strip().removesuffix(".").strip()
    while match := _WRAPPER.fullmatch(s):
        s = match.group(1).strip().removesuffix(".").strip()
    if s[:1] + s[-1:] in ("()", "{}"):  # by hand: a lazy pattern took seconds on '(' + spaces
        inner = s[1:-1].strip()
        if s[0] == "{" or _PLAIN_NUMBER.fullmatch(inner):  # a group; not (1,000): a pair, maybe
            s = inner
    if _GROUPED_NUMBER.fullmatch(s):
        s = s.replace(",", "")
    return Decimal("".join(s.split())) if _PLAIN_NUMBER.fullmatch(s) else None


def _unmath(text: str) -> str:
    """``text`` without ``$`` signs (a dollar sign, or inline math: ``$28$``) and without
    LaTeX's inline or display math delimiters around all of it (``\\(28\\)``, ``\\[28\\]``)."""
    s = text.replace("\\$", "").replace("$", "")
    match = _MATH_DELIMITED.fullmatch(s)
    return next(group for group in match.groups() if group is not None) if match else s


def _words(text: str) -> str | None:
    """``text`` as lowercase words with single spaces, when it is a word or phrase (see
    ``_WORDS``) once ``\\text{}``-like wrappers and a trailing ``.`` are dropped; else None."""
    s = text.strip().removesuffix(".").strip()
    while match := _WRAPPER.fullmatch(s):
        s = match.group(1).strip().removesuffix(".").strip()
    s = " ".join(s.lower().split())
    return s if _WORDS.fullmatch(s) else None


def _unit_name(word: str) -> str:
    """One name for a unit word, lowercase: singular, abbreviations spelled out (see
    ``_UNIT_NAMES``): ``cm`` and ``Centimetres`` are ``centimeter``."""
    singular = word
    if word not in _UNIT_NAMES:
        if word.endswith(("ches", "shes")):
            singular = word[:-2]
        elif word.endswith("s") and not word.endswith("ss") and len(word) > 2:
            singular = word[:-1]
    return _UNIT_NAMES.get(singular, singular)


def _unit(text: str) -> str | None:
    """The unit at the end of ``text`` after a quantity, as one name (``5\\text{ cm}^2`` and
    ``5\\text{ square centimeters}`` have ``centimeter^2``, ``90^\\circ`` has ``degree``),
    or None when there is none."""
    match = _UNIT.fullmatch(text.strip())
    if match is None:
        return None
    if match["degree"]:
        return "degree"
    spaced = re.sub(r"\\[,;:! ]|~", " ", match["unit"]).lower().strip().removesuffix(".")
    words = [_unit_name(word) for word in spaced.split()]
    power = match["power"] or ""
    if len(words) > 1 and words[0] in ("square", "sq", "cubic"):
        power, words = ("3" if words[0] == "cubic" else "2"), words[1:]
    return " ".join(words) + (f"^{power}" if power else "")


def _exact_decimals(latex: str) -> str:
    """``latex`` with each decimal written as the fraction it is (``0.125`` as
    ``\\frac{125}{1000}``, ``x^{\\frac{5}{10}}`` for ``x^0.5``), which math-verify compares
    exactly, a repeating one too (``0.1\\overline{6}`` as ``\\frac{16-1}{90}``, computed:
    ``\\frac{15}{90}``). A decimal after a thousands separator (``1,000.5``) is left as it is."""

    def exact(match: re.Match) -> str:
        whole, fixed, repeat = (*match.groups(), "")[:3]  # _DECIMAL has no repeating places
        if len(whole) == 3 and _AFTER_THOUSANDS.search(match.string, 0, match.start()):
            return match.group()
        # x = whole.fixed(repeat)...: x * 10^(fixed + repeat) - x * 10^fixed is a whole number
        numerator = int(whole + fixed + repeat) - (int(whole + fixed or "0") if repeat else 0)
        denominator = int("9" * len(repeat) + "0" * len(fixed)) if repeat else 10 ** len(fixed)
        fraction = f"\\frac{{{numerator}}}{{{denominator}}}"
        after_power = match.start() > 0 and match.string[match.start() - 1] in "^_"
        return f"{{{fraction}}}" if after_power else fraction

    return _DECIMAL.sub(exact, _REPEATING.sub(exact, latex))


def _from_e_notation(answer: str, golds: list) -> str:
    """``answer`` in LaTeX's notation when it is a number in E-notation (``1.0e-3`` is
    ``1.0\\times10^{-3}``) and no parsed gold holds Euler's number; else ``answer``."""
    import sympy

    match = _E_NOTATION.fullmatch(answer.strip())
    if match is None or any(
        isinstance(gold, (sympy.Basic, sympy.MatrixBase)) and gold.has(sympy.E, sympy.exp)
        for gold in golds
    ):
        return answer
    return f"{match.group(1)}\\times10^{{{int(match.group(2))}}}"


def _without_percent(text: str) -> str:
    """``text`` without a trailing ``%`` (``\\%``); math-verify ignores it anyway, but fails to
    parse it after a fraction."""
    match = _PERCENT.fullmatch(text.strip())
    return match.group(1) if match else text


def _percent_values(text: str, other: str, values: list) -> list:
    """The parsed ``values`` of a percent ``text`` over 100 (``10\\%`` is ``1/10``), when the
    ``other`` side has no ``%``; else none. Either side, gold or answer, may be ``text``."""
    import sympy

    if "%" in other or not _PERCENT.fullmatch(text.strip()):
        return []
    return [value / 100 for value in values if isinstance(value, sympy.Expr)]


def _plain_readings(text: str) -> list[Decimal]:
    """The values ``text`` may mean against a plain-number gold: a plain number's own (see
    :func:`plain_number`); a percent of one, its number and that over 100 (``15\\%``: 15 and
    0.15; ``$`` and math delimiters ignored, as there: ``$15\\%$``); else none."""
    number = plain_number(text)
    if number is not None:
        return [number]
    match = _PERCENT.fullmatch(_unmath(text).strip())
    number = plain_number(match.group(1)) if match else None
    return [] if number is None else [number, number.scaleb(-2)]  # exact: 15E-2


def _reads_as_set(golds: list) -> bool:
    """Whether the parsed gold is intervals an inequality can describe (``(-\\infty,3)``,
    ``[1,2)``, a union): not an open pair of finite numbers (``(1,3)``), which may be a
    point, nor a finite set (math-verify compares ``1<x<2`` with ``\\{1,2\\}`` by its ends)."""
    import sympy

    gold = next((gold for gold in golds if not isinstance(gold, str)), None)
    if isinstance(gold, sympy.Interval) and gold.left_open and gold.right_open:
        return not (gold.start.is_finite and gold.end.is_finite)
    return isinstance(gold, (sympy.Interval, sympy.Union))


def _near_irrational(answer: str, golds: list) -> bool:
    """Whether ``answer`` is a plain number within ``RELATIVE_TOLERANCE`` of an irrational
    real gold (``1.4142135624`` of ``\\sqrt{2}``)."""
    import sympy

    number = plain_number(answer)
    gold = next((gold for gold in golds if isinstance(gold, sympy.Expr)), None)
    if number is None or gold is None or isinstance(gold, sympy.Rational) or not gold.is_number:
        return False
    value = gold.evalf(30)
    if not isinstance(value, sympy.Float):  # complex, or not a number after all
        return False
    exact = Decimal(str(value))
    return abs(number - exact) <= RELATIVE_TOLERANCE * abs(exact)


def _power_cost(expr, var_bits: dict) -> tuple[float, float]:
    """:func:`_cost` of a power: its bits times the exponent, terms as multisets of the base's."""
    import sympy

    base, exponent = expr.as_base_exp()  # exp(x) is (E, x)
    base_bits, base_terms = _cost(base, var_bits)
    if isinstance(base, sympy.Function) and not base.is_number:
        base_terms = max(base_terms, 2)  # simplify rewrites a power of tan(x) like one of a sum
    exp_bits, exp_terms = _cost(exponent, var_bits)
    if exponent.is_Rational:
        n = abs(exponent.p)  # a root p/q builds no more than the power p
    else:
        n = 2.0**exp_bits if exp_bits < 64 else math.inf
    if base_terms == 1 or not exponent.is_Integer:
        terms = base_terms
    elif n > MAX_TERMS or base_terms > MAX_TERMS:
        terms = math.inf
    else:
        terms = math.comb(n + int(base_terms) - 1, n)
    return base_bits * n + exp_bits, max(terms, exp_terms)


def _cost(expr, var_bits: dict) -> tuple[float, float]:
    """Upper bounds on the bits of all exact numbers and on the terms grading ``expr`` builds.

    ``expr`` is an unevaluated sympy tree. A symbol counts as 2 bits, or as its upper bound
    when it is the variable of a sum or product (whose bits bound the work: terms times bits).
    """
    import sympy

    if isinstance(expr, sympy.Rational):
        return max(abs(expr.p).bit_length(), expr.q.bit_length(), 1), 1
    if isinstance(expr, sympy.Float):
        _, mantissa, exponent, _ = expr._mpf_  # value: mantissa * 2**exponent
        return mantissa.bit_length() + abs(exponent + mantissa.bit_length()) + 1, 1
    if isinstance(expr, sympy.Symbol):
        return var_bits.get(expr, 2), 1
    if isinstance(expr, (sympy.Pow, sympy.exp)):
        return _power_cost(expr, var_bits)
    if isinstance(expr, (sympy.Integral, sympy.Limit, sympy.Derivative)):
        return math.inf, math.inf  # unbounded work, and not a final answer anyway
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        inner, count = dict(var_bits), 1.0
        for var, *ends in expr.limits:
            inner[var] = max(_cost(end, var_bits)[0] for end in ends)
            count *= 2.0 ** inner[var] if inner[var] < 64 else math.inf
        body_bits, body_terms = _cost(expr.function, inner)
        return count * body_bits, count * body_terms
    costs = [_cost(a, var_bits) for a in expr.args]
    bits = sum(b for b, _ in costs)
    if isinstance(expr, sympy.Add):
        return bits, sum(t for _, t in costs)
    if isinstance(expr, sympy.Mul):
        return bits, math.prod(t for _, t in costs)
    # a function or a container is one term; its arguments expand on their own
    terms = 1 if all(t <= MAX_TERMS for _, t in costs) else math.inf
    module = expr.func.__module__ or ""  # None for an undefined function, f(x)
    if module.startswith(("sympy.functions.combinatorial", "sympy.functions.special.gamma")):
        n_bits = max((b for b, _ in costs), default=1)  # n! < 2^(n * bits(n))
        bits = n_bits * 2.0**n_bits if n_bits < 64 else math.inf
    return bits or 2, terms


def _parse_unevaluated(predicted: str, timeout: int | None) -> list:
    """math-verify's parse of ``predicted`` with sympy's evaluation off, kept out of its caches.

    math-verify caches parsed LaTeX and expressions keyed on the text alone, so an unevaluated
    tree left there was read back by the grading parse of the same text, the answer's or a
    later gold's (``even`` then missed ``\\text{even}``, and a pair's grade depended on what
    was graded before it); and a tree cached evaluated would be read here."""
    import sympy
    from math_verify import parse

    with _uncached_parsing(), sympy.evaluate(False):  # thread-local: others keep evaluating
        return parse(f"${predicted}$", parsing_timeout=timeout)


@contextmanager
def _uncached_parsing() -> Iterator[None]:
    """math-verify's parser without its caches, which it neither reads nor fills meanwhile.

    Called under ``_SYMPY_LOCK``. Another thread that parses meanwhile gets the same result,
    uncached. The evaluated parses keep the cache: an answer or gold graded again (each of
    a prompt's samples has the same gold) is read back, not parsed again."""
    from math_verify import parser

    cached = parser.parse_latex_cached, parser.parse_expr_cached
    parser.parse_latex_cached, parser.parse_expr_cached = (f.__wrapped__ for f in cached)
    try:
        yield
    finally:
        parser.parse_latex_cached, parser.parse_expr_cached = cached


def _too_costly(predicted: str, timeout: int | None) -> bool:
    """Whether grading ``predicted`` could build a huge number or expansion."""
    import sympy

    if _COMPUTED_WHILE_PARSING.search(predicted):
        return True
    try:
        parsed = _parse_unevaluated(predicted, timeout)
        if not parsed:  # unparsed here, so no bound on what the evaluating parse would do
            return True
        trees = []
        for item in parsed:
            if isinstance(item, sympy.MatrixBase):  # not a sympy.Basic; its entries are
                trees.extend(item)
            elif not isinstance(item, str):
                trees.append(item)
        for tree in trees:
            bits, terms = _cost(tree, {}) if isinstance(tree, sympy.Basic) else (math.inf, 0)
            if bits > MAX_EXACT_BITS or terms > MAX_TERMS:
                return True
        return False
    except Exception:  # an answer we cannot bound is not evaluated
        return True


def math_equal(predicted: str, gold: str) -> bool:
    """Whether ``predicted`` is the answer ``gold``.

    A plain-number gold needs a plain number of the same value (see :func:`plain_number`), or
    a percent of one whose number or value over 100 it is (:func:`_plain_readings`).
    Otherwise equal strings match, a word gold needs the same words, a unit on both sides the
    same unit, and else math-verify decides (numbers, fractions, LaTeX) unless
    :func:`_too_costly` refuses the answer, with the readings of the module's docstring.

    math-verify's own timeouts use ``signal.alarm``, which only works in the main
    thread (elsewhere it raises, which a blanket ``except`` would turn into a silent
    reward 0). Off the main thread they are disabled; :func:`_too_costly` keeps the
    work small, and the generator runs every env call under its own limit.
    """
    gold_number = plain_number(gold)
    if gold_number is not None:
        return gold_number in _plain_readings(predicted)
    if predicted.strip() == gold.strip():
        return True
    gold_words = _words(gold)
    if gold_words is not None:
        return _words(predicted) == gold_words
    if len(predicted) > MAX_ANSWER_CHARS:  # before _unit: its pattern is quadratic in length
        return False
    gold_unit, unit = _unit(gold), _unit(predicted)
    if gold_unit and unit and gold_unit != unit:
        return False
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    with _SYMPY_LOCK:
        return _verify(predicted, gold, timeout)


def _verify(predicted: str, gold: str, timeout: int | None) -> bool:
    """math-verify's grade, decimals read exactly, and the other readings of the module's
    docstring; 0 for an answer that :func:`_too_costly` refuses."""
    from math_verify import parse, verify

    golds = parse(f"${_exact_decimals(_without_percent(gold))}$", parsing_timeout=timeout)
    answer = _exact_decimals(_from_e_notation(_without_percent(predicted), golds))
    if not golds or _too_costly(answer, timeout):
        return False
    answers = parse(f"${answer}$", parsing_timeout=timeout)
    if not answers:
        return False
    golds = golds + _percent_values(gold, predicted, golds)
    answers = answers + _percent_values(predicted, gold, answers)
    same = verify(
        golds, answers, allow_set_relation_comp=_reads_as_set(golds), timeout_seconds=timeout
    )
    return bool(same) or _near_irrational(predicted, golds)


def _is_float(value: object) -> TypeGuard[numbers.Real]:
    """A float: Python's, or numpy's (``np.float32`` is no ``float``; both are real numbers
    that are not rational, as ints and fractions are)."""
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Rational)


def grade(text: str, gold: str) -> float:
    """1.0 when the response's final answer equals ``gold``, else 0.0 (no answer = 0).

    A float ``gold`` (a number column of a data file; numpy's too, a pandas column's) is read
    in full: ``1e-05`` is the plain number ``0.00001``, as ``str`` would not write it."""
    answer = extract_answer(text)
    if _is_float(gold) and math.isfinite(gold):
        gold = format(Decimal(str(gold)), "f")  # str: numpy's repr is np.float64(1e-05)
    return float(answer is not None and math_equal(answer, str(gold)))
