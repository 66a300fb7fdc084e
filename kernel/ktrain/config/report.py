"""Collecting every configuration problem into one report, each with the key path it concerns."""

from __future__ import annotations

import re

import attrs


@attrs.frozen
class Problem:
    """One problem: where (a key path like ``fsdp_config.reshard_after_forward``) and what to do."""

    path: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    @property
    def top_key(self) -> str:
        """The top-level key the path starts with: ``datasets`` for ``datasets[0].type``."""
        return re.split(r"[.\[, ]", self.path, maxsplit=1)[0]


@attrs.define
class Report:
    """Problems found while reading a config; ``error`` stops the run, ``warn`` is printed."""

    source: str = "config"
    problems: list[Problem] = attrs.Factory(list)

    def error(self, path: str, message: str) -> None:
        """Record a problem that stops the run."""
        self.problems.append(Problem(path, message, "error"))

    def warn(self, path: str, message: str) -> None:
        """Record a note about a key that is accepted but probably not what the user meant."""
        self.problems.append(Problem(path, message, "warning"))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def format(self) -> str:
        lines = [f"{len(self.errors)} problem(s) in {self.source}:"]
        lines += [f"  - {p}" for p in self.errors]
        lines += [f"  warning: {p}" for p in self.warnings]
        return "\n".join(lines)


class ConfigError(Exception):
    """Raised with a report that holds at least one error; the CLI prints it and exits with code 2."""

    def __init__(self, report: Report):
        super().__init__(report.format())
        self.report = report

    @classmethod
    def single(cls, path: str, message: str, source: str = "config") -> ConfigError:
        report = Report(source)
        report.error(path, message)
        return cls(report)
