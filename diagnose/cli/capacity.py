"""`diagnose capacity SEARCH`: the replicas and cost for a target rate within the SLO, from an SLO-edge search."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.cli import settings
from diagnose.cli.common import _json, _write


@click.command(context_settings=settings())
@click.argument("search", type=click.Path(path_type=Path))
@click.option("--target-rate", type=float, metavar="REQ/S", help="The request rate the deployment must serve within "
              "the SLO: how many replicas, at what cost.")
@click.option("--cost-per-hour", "cost", metavar="PRICE[xDEVICES]",
              help="Price of an hour of one replica (or per device-hour x devices, e.g. 4.1x8). Default: the price "
                   "the search's captures recorded (attach --cost-per-hour), when they did.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the answer as JSON.")
def capacity(search: Path, target_rate: float | None, cost: str | None, json_out: Path | None) -> None:
    """Capacity and cost from SEARCH (the search.json of attach --find-max-goodput, or its folder): the highest
    load a replica serves within the SLO, the replicas a --target-rate needs and their cost per hour and per
    million output tokens, each with its range (the throughput's interval at the edge and the edge's own
    uncertainty; docs/compare.md, "Capacity and cost")."""
    from diagnose.runs import capacity as cap
    from diagnose.signals.cost import parse_price

    price = parse_price(cost) if cost else None
    data = cap.read_search(search)
    if price is None:
        price = cap.recorded_price(data)
    result = cap.capacity(data, target_rate, price)
    _write(json_out, _json(result))
    for line in cap.lines(result):
        click.echo(line)
    if "per_replica" not in result:
        raise click.exceptions.Exit(1)
