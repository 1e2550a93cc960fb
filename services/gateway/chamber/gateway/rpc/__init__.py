"""gRPC: `chamber.proto`, its generated modules (at build time) and the server that serves them."""
