"""A Redis pace table's URI (docs/spec.md §6): one server (``redis://``, ``rediss://``, ``unix://``) or a Redis
Cluster (``redis+cluster://host:port[,host:port…]``, ``rediss+cluster://``), the key layout option
(``layout=table|sharded``), the password hidden in messages."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["CLUSTER_SCHEMES", "LAYOUTS", "cluster_nodes", "redact_uri", "split_layout"]

#: The URL schemes of a Redis Cluster, and the scheme of one node's URL each stands for.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: The key layouts of a table (the URL option ``layout=``, docs/scale.md): ``table`` (the default: one hash
#: tag, ``{pace}``, for the whole table, so one slot of a cluster) and ``sharded`` (one hash tag per row, so the
#: rows spread over every slot, and bookings over every node).
LAYOUTS = ("table", "sharded")


def redact_uri(uri: str) -> str:
    """``uri`` with its password (in the authority or a ``password=`` query parameter) replaced by ``***``,
    for messages and logs."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = parts.query
    if "password=" in query:
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(query, keep_blank_values=True)])
    if (netloc, query) == (parts.netloc, parts.query):
        return uri
    rebuilt = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return rebuilt if netloc else rebuilt.replace(":", "://", 1)  # unix:///path keeps its empty authority


def split_layout(uri: str) -> tuple[str, str]:
    """A Redis URL without its ``layout=`` option (which redis-py does not know), and the layout it names
    (:data:`LAYOUTS`; ``table`` when absent).

    Raises:
        ValueError: a layout that is not one of :data:`LAYOUTS`.
    """
    parts = urlsplit(uri)
    if "layout=" not in parts.query:
        return uri, "table"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    layouts = [v for k, v in pairs if k == "layout"]
    layout = layouts[-1] if layouts else "table"
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    query = urlencode([(k, v) for k, v in pairs if k != "layout"])
    rebuilt = urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
    return (rebuilt if parts.netloc else rebuilt.replace(":", "://", 1)), layout


def cluster_nodes(uri: str) -> tuple[str, list[tuple[str, int]]]:
    """A ``redis+cluster://[user:password@]host:port[,host:port…][/0][?options]`` URL as the URL of its first
    node (``redis://…`` or ``rediss://…``, with the credentials and options) and the other nodes.

    Raises:
        ValueError: no node, a port that is not a number, or a database other than 0.
    """
    parts = urlsplit(uri)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ValueError(f"{item!r} names no host")
        if port and not port.isdigit():
            raise ValueError(f"port {port!r} is not a number")
        nodes.append((host, int(port) if port else 6379))
    if not nodes:
        raise ValueError("it names no node")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    first_host, first_port = nodes[0]
    first = f"[{first_host}]:{first_port}" if ":" in first_host else f"{first_host}:{first_port}"
    netloc = f"{userinfo}{at}{first}"
    return urlunsplit((CLUSTER_SCHEMES[parts.scheme.lower()], netloc, "", parts.query, "")), nodes[1:]
