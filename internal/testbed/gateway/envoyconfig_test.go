package gateway_test

import (
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/pkg/extproc"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// unpack decodes an Any into out and runs its generated validation, which
// does not reach inside Any fields on its own.
func unpack(t *testing.T, what string, a interface{ UnmarshalTo(proto.Message) error }, out proto.Message) {
	t.Helper()
	if err := a.UnmarshalTo(out); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := out.(validator).ValidateAll(); err != nil {
		t.Fatalf("%s does not validate: %v", what, err)
	}
}

// TestEnvoyConfig checks that config/envoy/envoy.yaml is a valid v3
// bootstrap (as far as the API's own validation rules go; there is no Envoy
// binary here) and that it wires SPEC §7: ORIGINAL_DST routing on the
// destination header, the ext_proc filter in FULL_DUPLEX_STREAMED with the
// trailer modes Envoy requires for it, and a TLS HTTP/2 ext_proc cluster
// with a gRPC health check on the ext_proc service name.
func TestEnvoyConfig(t *testing.T) {
	raw, err := os.ReadFile("../../../config/envoy/envoy.yaml")
	if err != nil {
		t.Fatalf("read envoy.yaml: %v", err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("envoy.yaml is not YAML: %v", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml is not a v3 Bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("bootstrap does not validate: %v", err)
	}

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	pool := clusters["inference_pool"]
	if pool.GetType() != clusterv3.Cluster_ORIGINAL_DST || pool.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
		!pool.GetOriginalDstLbConfig().GetUseHttpHeader() ||
		pool.GetOriginalDstLbConfig().GetHttpHeaderName() != extproc.HeaderDestinationEndpoint {
		t.Errorf("inference_pool cluster is not ORIGINAL_DST on %s: %v", extproc.HeaderDestinationEndpoint, pool)
	}

	epp := clusters["laneway_epp"]
	var po upstreamhttpv3.HttpProtocolOptions
	unpack(t, "laneway_epp protocol options", epp.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], &po)
	if po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("laneway_epp does not speak HTTP/2")
	}
	var tlsCtx tlsv3.UpstreamTlsContext
	unpack(t, "laneway_epp TLS", epp.GetTransportSocket().GetTypedConfig(), &tlsCtx)
	if alpn := tlsCtx.GetCommonTlsContext().GetAlpnProtocols(); len(alpn) != 1 || alpn[0] != "h2" {
		t.Errorf("laneway_epp ALPN %v, want [h2]", alpn)
	}
	hcs := epp.GetHealthChecks()
	if len(hcs) != 1 || hcs[0].GetGrpcHealthCheck().GetServiceName() != extproc.ServiceName {
		t.Errorf("laneway_epp health checks %v, want gRPC on %s", hcs, extproc.ServiceName)
	}

	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(listeners))
	}
	var hcm hcmv3.HttpConnectionManager
	unpack(t, "http_connection_manager", listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcm)
	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[0].GetName() != "envoy.filters.http.ext_proc" || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v, want ext_proc then router", filters)
	}
	var ep extprocfilterv3.ExternalProcessor
	unpack(t, "ext_proc filter", filters[0].GetTypedConfig(), &ep)
	pm := ep.GetProcessingMode()
	full := extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	send := extprocfilterv3.ProcessingMode_SEND
	if pm.GetRequestHeaderMode() != send || pm.GetResponseHeaderMode() != send ||
		pm.GetRequestBodyMode() != full || pm.GetResponseBodyMode() != full ||
		pm.GetRequestTrailerMode() != send || pm.GetResponseTrailerMode() != send {
		t.Errorf("processing mode %v", pm)
	}
	if ep.GetFailureModeAllow() || ep.GetAllowModeOverride() {
		t.Error("ext_proc must not fail open or allow mode overrides")
	}
	if ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "laneway_epp" {
		t.Errorf("ext_proc talks to %v", ep.GetGrpcService())
	}
	if ep.GetMessageTimeout().AsDuration().Seconds() < 60 {
		t.Errorf("message_timeout %v is shorter than a queue wait", ep.GetMessageTimeout().AsDuration())
	}
	fwd := ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped()
	if len(fwd) != 2 || fwd[0] != extproc.MetadataNamespaceSubset || fwd[1] != extproc.MetadataNamespaceLB {
		t.Errorf("forwarded metadata namespaces %v", fwd)
	}
}

// TestReadmeShowsEnvoyConfig keeps the configuration shown in
// cmd/gateway/README.md identical to the validated file.
func TestReadmeShowsEnvoyConfig(t *testing.T) {
	readme, err := os.ReadFile("../../../cmd/gateway/README.md")
	if err != nil {
		t.Fatalf("read README: %v", err)
	}
	cfg, err := os.ReadFile("../../../config/envoy/envoy.yaml")
	if err != nil {
		t.Fatalf("read envoy.yaml: %v", err)
	}
	if !strings.Contains(string(readme), "```yaml\n"+string(cfg)+"```\n") {
		t.Error("cmd/gateway/README.md does not show config/envoy/envoy.yaml verbatim; copy the file into its yaml block")
	}
}
