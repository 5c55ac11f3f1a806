"""The service runtime every Orchard service is built on: server, settings and logging."""

from orchard.runtime.logs import configure_logging
from orchard.runtime.server import GrpcServer
from orchard.runtime.settings import ServiceSettings, SettingsError, load_settings

__all__ = ["GrpcServer", "ServiceSettings", "SettingsError", "configure_logging", "load_settings"]
