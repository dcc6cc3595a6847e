"""Operating the gateway: the admin API, live fleet changes, hot reload and discovery."""
