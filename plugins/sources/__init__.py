"""Tool sources configured as ``[tools.NAME]``: MCP servers (stdio or streamable HTTP)
and HTTP tools, gathered with the plugins' tools in one :class:`ToolCatalog`."""

from plugins.sources.catalog import ToolCatalog
from plugins.sources.specs import (
    HttpToolSpec,
    McpHttpSpec,
    McpStdioSpec,
    SourceSpec,
    ToolSourceSpec,
)

__all__ = [
    "HttpToolSpec",
    "McpHttpSpec",
    "McpStdioSpec",
    "SourceSpec",
    "ToolCatalog",
    "ToolSourceSpec",
]
