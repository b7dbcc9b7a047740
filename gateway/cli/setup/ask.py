"""How `switchboard setup` talks: questions in a terminal, defaults (or a clear failure) with --yes."""

from __future__ import annotations

import click


class SetupFailed(click.ClickException):
    """Setup cannot go on: one line saying why and what to pass or fix (exit 1)."""

    def show(self, file=None) -> None:  # click's signature
        click.echo(f"error: {self.format_message()}", err=True)


class Ask:
    """Questions when ``interactive``; else every answer is its default, and a question without one fails."""

    def __init__(self, interactive: bool):
        self.interactive = interactive

    # -- telling
    def section(self, title: str) -> None:
        click.echo("")
        click.secho(title, bold=True)

    def say(self, text: str) -> None:
        click.echo(f"  {text}")

    def ok(self, text: str) -> None:
        click.echo(f"  ✓ {text}")

    def bad(self, text: str) -> None:
        click.echo(f"  ✗ {text}")

    # -- asking
    def text(self, question: str, default: str | None) -> str:
        if not self.interactive:
            if default is None:
                raise SetupFailed(f"{question}: no answer given (run setup in a terminal, or pass the flag for it)")
            return default
        return str(click.prompt(f"  {question}", default=default, show_default=bool(default)))

    def secret(self, question: str) -> str:
        if not self.interactive:
            raise SetupFailed(f"{question}: no answer given (pass it as a flag)")
        return str(click.prompt(f"  {question}", hide_input=True)).strip()

    def confirm(self, question: str, default: bool) -> bool:
        if not self.interactive:
            return default
        return bool(click.confirm(f"  {question}", default=default))

    def pick_index(self, question: str, options: list[str], default: int = 0) -> int:
        if not self.interactive:
            return default
        click.echo(f"  {question}")
        for i, option in enumerate(options, 1):
            click.echo(f"    {i}. {option}")
        choice = click.prompt("  Number", type=click.IntRange(1, len(options)), default=default + 1)
        return int(choice) - 1

    def pick(self, question: str, options: list[str], default: str) -> str:
        return options[self.pick_index(question, options, options.index(default))]
