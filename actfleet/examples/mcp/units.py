"""A small MCP stdio server shipped as an example: unit conversion (length, mass,
temperature, volume), on the `mcp` package's server API.

`actfleet demo` configures it on its nodes (`mcp.json` beside this file); run it yourself
with `python -m actfleet.examples.mcp.units`. The model calls it as JSON tool calls
(`units_convert`) or from code (`from mcptools.units.convert import run as convert`).
"""

from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

Quantity = Literal["length", "mass", "temperature", "volume"]

_FACTORS: dict[str, dict[str, float]] = {
    "length": {
        "mm": 0.001,
        "cm": 0.01,
        "m": 1.0,
        "km": 1000.0,
        "in": 0.0254,
        "ft": 0.3048,
        "yd": 0.9144,
        "mi": 1609.344,
    },
    "mass": {"g": 0.001, "kg": 1.0, "t": 1000.0, "oz": 0.028349523125, "lb": 0.45359237},
    "volume": {"ml": 0.001, "l": 1.0, "m3": 1000.0, "floz": 0.0295735295625, "gal": 3.785411784},
}
"""Size of each unit in its quantity's base unit (m, kg, l)."""
_TEMPERATURES = ("C", "F", "K")

server = MCPServer("units")


def _quantity(unit: str) -> str:
    if unit in _TEMPERATURES:
        return "temperature"
    for quantity, units in _FACTORS.items():
        if unit in units:
            return quantity
    known = ", ".join([*_TEMPERATURES, *(u for units in _FACTORS.values() for u in units)])
    raise ToolError(f"unknown unit {unit!r}; the units are: {known}")


def _to_kelvin(value: float, unit: str) -> float:
    return {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[unit]


def _from_kelvin(value: float, unit: str) -> float:
    return {"C": value - 273.15, "F": (value - 273.15) * 9 / 5 + 32, "K": value}[unit]


@server.tool()
def list_units(quantity: Quantity) -> list[str]:
    """The units of a quantity, by their symbols (e.g. length: mm, cm, m, km, in, ft, ...)."""
    return list(_TEMPERATURES) if quantity == "temperature" else list(_FACTORS[quantity])


@server.tool()
def convert(value: float, from_unit: str, to_unit: str, digits: int = 6) -> float:
    """Convert `value` between units of one quantity (km, mi, kg, lb, C, F, l, gal, ...)."""
    source, target = _quantity(from_unit), _quantity(to_unit)
    if source != target:
        raise ToolError(f"cannot convert {source} ({from_unit}) to {target} ({to_unit})")
    if source == "temperature":
        result = _from_kelvin(_to_kelvin(value, from_unit), to_unit)
    else:
        result = value * _FACTORS[source][from_unit] / _FACTORS[source][to_unit]
    return round(result, digits)


if __name__ == "__main__":
    server.run()
