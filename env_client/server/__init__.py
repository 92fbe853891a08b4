"""The embedded MiniWoB++ environment server (``python -m env_client.server``).

Importing this package is cheap; the server's own modules (aiohttp app, Selenium browsers)
load only in the server process.
"""

from env_client.server.launcher import EmbeddedServer, EmbeddedServerError, start_embedded_server

__all__ = ["EmbeddedServer", "EmbeddedServerError", "start_embedded_server"]
