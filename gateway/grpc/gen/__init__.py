"""Python stubs generated from proto/llmgateway/v1/gateway.proto (`python -m gateway.grpc.gen`)."""
