"""``statequery shell`` on a running ``statequery serve``: a SQL shell on its Spark Connect server.

It opens at once (no JVM: :mod:`statequery.cli.connect` speaks Connect with ``grpc`` and
``pyarrow``) and keeps one Connect session for all its statements, so ``USE db`` and ``SET``
last until it exits.

- Interactively: statements end with ``;`` (over several lines if need be); results are drawn
  as the other commands draw tables; an error is one line; Ctrl-C interrupts the running
  statement on the server (or drops the line being typed); Ctrl-D, ``quit;`` or ``exit;``
  leave. The history is kept in ``$XDG_DATA_HOME/statequery/shell_history``
  (``~/.local/share/statequery/shell_history``; ``$STATEQUERY_SHELL_HISTORY`` overrides it).
- ``-e SQL`` / ``-f FILE`` (or statements on a standard input that is not a terminal): what
  spark-sql prints, so that a script reads both alike: each row on a line, its values
  separated by tabs, no header, values written as Spark's ``HiveResult`` writes them (``NULL``,
  ``[1,2]``, ``{"a":1}``, ``1.0E10``, ...), ``SHOW TABLES`` the table names only and
  ``DESCRIBE`` its three columns padded to 20 characters. Unless ``-S``, a ``Time taken: ...``
  line per statement on standard error, as spark-sql's. The first failing statement stops
  the run with exit status 1 (Ctrl-C: 130).
"""

from __future__ import annotations

import datetime
import decimal
import math
import os
import re
import struct
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import pyarrow as pa

    from statequery.cli.connect import ConnectSession

__all__ = ["SqlShell", "history_file", "hive_string", "result_lines", "split_statements"]

#: rows drawn for one result in the interactive shell (-e and -f print all of them)
MAX_SHOWN = 1000


class StatementError(Exception):
    """A statement the server refused (its one-line message)."""


def split_statements(text: str) -> tuple[list[str], str]:
    """The complete statements of ``text`` (each ended by a ``;`` outside quotes and comments;
    without it, stripped; those with nothing but comments left out) and the unfinished rest."""
    out: list[str] = []
    start = i = 0
    n = len(text)
    quote = ""
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote != "`":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"`":
            quote = c
        elif c == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        elif c == ";":
            statement = text[start:i].strip()
            if _has_code(statement):
                out.append(statement)
            start = i + 1
        i += 1
    return out, text[start:]


def _has_code(statement: str) -> bool:
    """Whether anything but comments and blanks is left of ``statement``."""
    bare = re.sub(r"/\*.*?\*/", " ", statement, flags=re.S)
    bare = re.sub(r"--[^\n]*", " ", bare)
    return bool(bare.strip())


def _java_double(x: float, digits: str | None = None) -> str:
    """``Double.toString`` (``Float.toString`` with the float's own shortest ``digits``):
    plain from 10^-3 up to 10^7, else ``1.0E10``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    d = decimal.Decimal(digits or repr(x))
    if 1e-3 <= abs(x) < 1e7:
        text = format(d, "f")
        return text if "." in text else text + ".0"
    sign, figures, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, figures)).rstrip("0") or "0"
    power = len(figures) + exponent - 1
    return f"{'-' if sign else ''}{shown[0]}.{shown[1:] or '0'}E{power}"


def _java_float(x: float) -> str:
    if math.isnan(x) or math.isinf(x) or x == 0:
        return _java_double(x)
    packed = struct.pack("<f", x)
    for precision in range(1, 10):
        text = f"{x:.{precision}g}"
        if struct.pack("<f", float(text)) == packed:
            return _java_double(float(text), text)
    return _java_double(x)


def _timestamp(value: datetime.datetime) -> str:
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text


def _day_time(value: datetime.timedelta) -> str:
    micros = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    days, rest = divmod(micros, 86_400_000_000)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, rest = divmod(rest, 1_000_000)
    return f"{sign}{days} {hours:02d}:{minutes:02d}:{seconds:02d}.{rest * 1000:09d}"


def hive_string(value: Any, arrow_type: pa.DataType, nested: bool = False) -> str:
    """One value as spark-sql prints it (Spark's ``HiveResult.toHiveString``), from the Python
    value of an Arrow column of type ``arrow_type``."""
    import pyarrow.types as pt

    if value is None:
        return "null" if nested else "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if pt.is_float64(arrow_type):
        return _java_double(float(value))
    if pt.is_float32(arrow_type) or pt.is_float16(arrow_type):
        return _java_float(float(value))
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"' if nested else value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, datetime.datetime):
        return _timestamp(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return _day_time(value)
    if pt.is_map(arrow_type):
        pairs = (hive_string(k, arrow_type.key_type, True) + ":"
                 + hive_string(v, arrow_type.item_type, True) for k, v in value)
        return "{" + ",".join(sorted(pairs)) + "}"
    if pt.is_list(arrow_type) or pt.is_large_list(arrow_type) \
            or pt.is_fixed_size_list(arrow_type):
        return "[" + ",".join(hive_string(v, arrow_type.value_type, True) for v in value) + "]"
    if pt.is_struct(arrow_type):
        return "{" + ",".join(
            f'"{f.name}":{hive_string(value.get(f.name), f.type, True)}' for f in arrow_type
        ) + "}"
    return str(value)


_SHOW_NAMES = re.compile(r"^\s*show\s+(tables|views)\b(?!.*\bextended\b)", re.I | re.S)
_DESCRIBE = re.compile(r"^\s*desc(ribe)?\b", re.I)


def _columns(table: pa.Table) -> list[list[Any]]:
    """The Python values of each column (by position: Spark allows repeated names)."""
    import pyarrow as pa

    from statequery.cli.output import python_rows

    out = []
    for i in range(table.num_columns):
        single = pa.table([table.column(i)], names=["c"])
        out.append([row["c"] for row in python_rows(single)])
    return out


def result_lines(statement: str, table: pa.Table) -> list[str]:
    """The lines spark-sql prints for ``statement``'s result ``table``."""
    if table.num_columns == 0:
        return []
    columns = _columns(table)
    if _SHOW_NAMES.match(statement) and table.num_columns >= 2:
        return [hive_string(v, table.schema.field(1).type) for v in columns[1]]
    if _DESCRIBE.match(statement) and table.column_names == ["col_name", "data_type", "comment"]:
        return ["\t".join(f"{v or '':<20}" for v in row) for row in zip(*columns, strict=True)]
    types = [f.type for f in table.schema]
    return ["\t".join(hive_string(v, t) for v, t in zip(row, types, strict=True))
            for row in zip(*columns, strict=True)]


def history_file() -> Path:
    """``$STATEQUERY_SHELL_HISTORY``, else ``shell_history`` in the statequery user folder
    (``$XDG_DATA_HOME/statequery``, ``~/.local/share/statequery``)."""
    if os.environ.get("STATEQUERY_SHELL_HISTORY"):
        return Path(os.environ["STATEQUERY_SHELL_HISTORY"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base, "statequery", "shell_history")


_QUIT = re.compile(r"^\s*(quit|exit)\s*$", re.I)
_USE = re.compile(r"^\s*use\b", re.I)


class SqlShell:
    """Statements on one Connect session (:class:`statequery.cli.connect.ConnectSession`),
    printed for a script (:meth:`run_script`) or a person (:meth:`interactive`)."""

    def __init__(self, session: ConnectSession, silent: bool = False, out: TextIO | None = None,
                 err: TextIO | None = None) -> None:
        self.session = session
        self.silent = silent
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.database = "default"

    def execute(self, statement: str) -> pa.Table:
        """Run one statement; its rows (a pyarrow Table). Raises :class:`StatementError`, or
        :class:`statequery.cli.connect.Interrupted` on Ctrl-C."""
        from statequery.cli.connect import ConnectError, connect_error

        try:
            table = self.session.sql(statement)
            if _USE.match(statement):
                current = self.session.sql("SELECT current_database()")
                self.database = str(current.column(0)[0].as_py())
        except ConnectError as e:
            raise StatementError(connect_error(str(e))) from None
        return table

    def run_script(self, text: str) -> int:
        """Run the statements of ``text`` (the last one may lack its ``;``) as spark-sql -e
        does; 0, or 1 at the first failing statement (its message on standard error)."""
        from statequery.cli.connect import Interrupted

        statements, rest = split_statements(text)
        if _has_code(rest):
            statements.append(rest.strip())
        for statement in statements:
            if _QUIT.match(statement):
                return 0
            started = time.monotonic()
            try:
                table = self.execute(statement)
            except StatementError as e:
                self.err.write(f"statequery: {e}\n")
                return 1
            except Interrupted as e:
                self.err.write(f"statequery: {e}\n")
                return 130
            lines = result_lines(statement, table)
            for line in lines:
                self.out.write(line + "\n")
            self.out.flush()
            if not self.silent:
                taken = time.monotonic() - started
                fetched = f", Fetched {len(lines)} row(s)" if table.num_columns else ""
                self.err.write(f"Time taken: {taken:.3f} seconds{fetched}\n")
                self.err.flush()
        return 0

    def show(self, statement: str) -> bool:
        """Run one statement for a person: its rows as a table, an error as one line.
        False when it was ``quit`` or ``exit``."""
        from statequery.cli.connect import Interrupted
        from statequery.cli.output import _console, _print_rows

        if _QUIT.match(statement):
            return False
        started = time.monotonic()
        try:
            table = self.execute(statement)
        except StatementError as e:
            self.err.write(f"Error: {e}\n")
            self.err.flush()
            return True
        except Interrupted as e:
            self.err.write(f"{str(e)[:1].upper()}{str(e)[1:]}\n")
            self.err.flush()
            return True
        taken = time.monotonic() - started
        console = _console()
        if table.num_columns:
            shown = table.slice(0, MAX_SHOWN)
            _print_rows(shown, None)
            rows = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
            if shown.num_rows < table.num_rows:
                rows = f"{shown.num_rows} of {rows} shown (-e or -f prints them all)"
            if not self.silent:
                console.print(f"{rows} in {taken:.2f} s", style="dim", highlight=False)
        elif not self.silent:
            console.print(f"OK in {taken:.2f} s", style="dim", highlight=False)
        return True

    def prompt(self) -> str:
        return f"statequery ({self.database})> "

    def interactive(self) -> int:
        """Read statements from the terminal until Ctrl-D, ``quit;`` or ``exit;``."""
        import readline

        history = history_file()
        try:
            readline.read_history_file(history)
        except OSError:
            pass
        readline.set_history_length(2000)
        try:
            return self._loop(readline)
        finally:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(history)
            except OSError as e:
                self.err.write(f"statequery: cannot write the history {history}: "
                               f"{e.strerror or e}\n")

    def _loop(self, readline: ModuleType) -> int:
        buffer = ""
        first = readline.get_current_history_length()
        while True:
            prompt = self.prompt()
            if buffer:
                prompt = " " * (len(prompt) - 2) + "> "
            else:
                first = readline.get_current_history_length()
            try:
                line = input(prompt)
            except EOFError:
                self.out.write("\n")
                return 0
            except KeyboardInterrupt:
                self.out.write("\n")
                buffer = ""
                continue
            buffer += line + "\n"
            statements, rest = split_statements(buffer)
            if not statements and not _QUIT.match(buffer):
                if not _has_code(buffer):
                    buffer = ""
                continue
            if _QUIT.match(buffer):
                return 0
            # the history keeps a statement typed over several lines as one line (unless a
            # -- comment would swallow the lines after it)
            typed = readline.get_current_history_length() - first
            if typed > 1 and not re.search(r"--", buffer):
                for _ in range(typed):
                    readline.remove_history_item(first)
                readline.add_history(" ".join(buffer.split()))
            buffer = rest if _has_code(rest) else ""
            for statement in statements:
                try:
                    if not self.show(statement):
                        return 0
                except KeyboardInterrupt:  # a second Ctrl-C while the first was being handled
                    self.out.write("\n")
                    break


def run_shell(info: dict[str, Any], database: str | None, script: str | None,
              init: str | None, silent: bool) -> int:
    """``statequery shell`` on the server ``info`` describes (its ``server.json``): the
    statements of ``script`` (-e, -f), else those of ``init`` (the text of -i's file) then
    the terminal's."""
    from statequery.cli.connect import ConnectSession, Interrupted
    from statequery.serverinfo import server_token

    token = server_token(info)
    if script is None and not sys.stdin.isatty():
        script = sys.stdin.read()
    with ConnectSession(str(info["host"]), int(info["connect_port"]), token=token) as session:
        shell = SqlShell(session, silent=silent)
        if database:
            try:
                shell.execute(f"USE `{database.replace('`', '``')}`")
            except StatementError as e:
                shell.err.write(f"statequery: {e}\n")
                return 1
            except Interrupted:
                return 130
        if script is not None:
            return shell.run_script(script)
        if not silent:
            shell.err.write(
                f"statequery: Spark {info.get('spark', '')} at {info['connect']} (the server, "
                f"pid {info['pid']}); statements end with ;  Ctrl-C stops one, Ctrl-D leaves\n"
            )
        if init is not None:
            statements, rest = split_statements(init)
            if _has_code(rest):
                statements.append(rest.strip())
            for statement in statements:
                if not shell.show(statement):
                    return 0
        return shell.interactive()
