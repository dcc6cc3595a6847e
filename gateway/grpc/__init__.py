"""The gRPC front end: server, service, message conversion, status mapping, generated stubs."""
