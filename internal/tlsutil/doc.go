// Package tlsutil provides the TLS material of the picker's gRPC listener:
// an in-memory self-signed certificate (the default, like the upstream
// endpoint picker, since Envoy reaches the picker inside the cluster and is
// configured not to verify it) or a key pair loaded from a directory holding
// tls.crt and tls.key (a mounted Kubernetes TLS secret), reloaded when the
// files change so a rotated secret takes effect without a restart.
package tlsutil
