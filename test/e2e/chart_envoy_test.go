package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	healthcheckv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/health_check/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/laneway-dev/laneway/pkg/extproc"
)

// unpackValid decodes an Any and runs the message's generated validation,
// which does not reach inside Any fields on its own.
func unpackValid(t *testing.T, what string, a *anypb.Any, out proto.Message) {
	t.Helper()
	if err := a.UnmarshalTo(out); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if v, ok := out.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("%s does not validate: %v", what, err)
		}
	}
}

// envoyBootstrap parses the rendered Envoy ConfigMap's envoy.yaml as an
// Envoy v3 Bootstrap and runs the API's validation rules on it.
func envoyBootstrap(t *testing.T, objs []*unstructured.Unstructured, name string) (*corev1.ConfigMap, *bootstrapv3.Bootstrap) {
	t.Helper()
	cm := fromUnstructured[corev1.ConfigMap](t, mustFind(t, objs, "ConfigMap", name))
	js, err := yaml.YAMLToJSON([]byte(cm.Data["envoy.yaml"]))
	if err != nil {
		t.Fatalf("envoy.yaml is not YAML: %v", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml is not a v3 Bootstrap: %v\n%s", err, cm.Data["envoy.yaml"])
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("bootstrap does not validate: %v", err)
	}
	return cm, &bs
}

// envoyClusters returns the bootstrap's static clusters by name.
func envoyClusters(bs *bootstrapv3.Bootstrap) map[string]*clusterv3.Cluster {
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	return clusters
}

// envoyListeners returns each listener's HTTP connection manager by
// listener name.
func envoyListeners(t *testing.T, bs *bootstrapv3.Bootstrap) map[string]*hcmv3.HttpConnectionManager {
	t.Helper()
	listeners := map[string]*hcmv3.HttpConnectionManager{}
	for _, l := range bs.GetStaticResources().GetListeners() {
		var hcm hcmv3.HttpConnectionManager
		unpackValid(t, "listener "+l.GetName(), l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcm)
		listeners[l.GetName()] = &hcm
	}
	return listeners
}

// TestChartEnvoyConfig parses the Envoy data plane's configuration as an
// Envoy v3 Bootstrap (there is no Envoy binary here, so the API's own
// validation rules are the check) and verifies the SPEC §7 wiring, with the
// picker serving TLS (the default), plaintext (the envoy CI set) and
// mutual TLS (Envoy presents a client certificate).
func TestChartEnvoyConfig(t *testing.T) {
	sets := ciValueSets(t)
	tests := []struct {
		name   string
		render renderArgs
		tls    bool
		// clientCert is envoy.clientCertSecret, "" for none.
		clientCert string
	}{
		{name: "tls", tls: true, render: renderArgs{release: "gw", namespace: "edge", set: []string{"envoy.enabled=true", "envoy.messageTimeout=120s"}}},
		{name: "plaintext", render: renderArgs{release: "gw", namespace: "edge", valuesFiles: []string{sets["envoy"]}, set: []string{"envoy.messageTimeout=120s"}}},
		{name: "mutual tls", tls: true, clientCert: "envoy-client", render: renderArgs{release: "gw", namespace: "edge", set: []string{
			"envoy.enabled=true", "envoy.messageTimeout=120s", "epp.clientCA.secret=gateway-ca", "envoy.clientCertSecret=envoy-client",
		}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.render)
			cm, bs := envoyBootstrap(t, objs, "gw-laneway-envoy")
			if a := bs.GetAdmin().GetAddress().GetSocketAddress().GetAddress(); a != "127.0.0.1" {
				t.Errorf("admin listens on %q, want loopback only", a)
			}

			clusters := envoyClusters(bs)
			pool := clusters["inference_pool"]
			if pool.GetType() != clusterv3.Cluster_ORIGINAL_DST || pool.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED ||
				!pool.GetOriginalDstLbConfig().GetUseHttpHeader() ||
				pool.GetOriginalDstLbConfig().GetHttpHeaderName() != extproc.HeaderDestinationEndpoint {
				t.Errorf("inference_pool is not ORIGINAL_DST/CLUSTER_PROVIDED on %s: %v", extproc.HeaderDestinationEndpoint, pool)
			}

			epp := clusters["laneway_epp"]
			if epp.GetType() != clusterv3.Cluster_STRICT_DNS {
				t.Errorf("laneway_epp type %v, want STRICT_DNS (the picker's Service)", epp.GetType())
			}
			sa := epp.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
			if sa.GetAddress() != "gw-laneway.edge.svc.cluster.local" || sa.GetPortValue() != 9002 {
				t.Errorf("laneway_epp targets %s:%d, want the picker Service gw-laneway.edge.svc.cluster.local:9002", sa.GetAddress(), sa.GetPortValue())
			}
			var po upstreamhttpv3.HttpProtocolOptions
			unpackValid(t, "laneway_epp protocol options", epp.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], &po)
			if po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
				t.Error("laneway_epp does not speak HTTP/2")
			}
			if tc.tls {
				var tlsCtx tlsv3.UpstreamTlsContext
				unpackValid(t, "laneway_epp TLS", epp.GetTransportSocket().GetTypedConfig(), &tlsCtx)
				if alpn := tlsCtx.GetCommonTlsContext().GetAlpnProtocols(); !slices.Equal(alpn, []string{"h2"}) {
					t.Errorf("laneway_epp ALPN %v, want [h2]", alpn)
				}
				envoy := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "gw-laneway-envoy"))
				checkEnvoyClientCert(t, tc.clientCert, tlsCtx.GetCommonTlsContext(), cm.Data, envoy)
			} else if epp.GetTransportSocket() != nil {
				t.Errorf("laneway_epp uses TLS although the picker serves plaintext: %v", epp.GetTransportSocket())
			}
			hcs := epp.GetHealthChecks()
			if len(hcs) != 1 || hcs[0].GetGrpcHealthCheck().GetServiceName() != extproc.ServiceName {
				t.Errorf("laneway_epp health checks %v, want gRPC on %s", hcs, extproc.ServiceName)
			}

			listeners := envoyListeners(t, bs)
			filters := listeners["inference"].GetHttpFilters()
			// Client hints are not trusted by default: a header_mutation
			// filter removes them first (TestChartTrustClientHints).
			if len(filters) != 3 || filters[0].GetName() != "envoy.filters.http.header_mutation" ||
				filters[1].GetName() != "envoy.filters.http.ext_proc" || filters[2].GetName() != "envoy.filters.http.router" {
				t.Fatalf("inference listener filters %v, want header_mutation, ext_proc, router", filters)
			}
			var ep extprocfilterv3.ExternalProcessor
			unpackValid(t, "ext_proc filter", filters[1].GetTypedConfig(), &ep)
			pm := ep.GetProcessingMode()
			full, send := extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_SEND
			if pm.GetRequestHeaderMode() != send || pm.GetResponseHeaderMode() != send ||
				pm.GetRequestBodyMode() != full || pm.GetResponseBodyMode() != full ||
				pm.GetRequestTrailerMode() != send || pm.GetResponseTrailerMode() != send {
				t.Errorf("processing mode %v, want headers SEND and bodies FULL_DUPLEX_STREAMED", pm)
			}
			if ep.GetFailureModeAllow() || ep.GetAllowModeOverride() {
				t.Error("ext_proc must not fail open or allow mode overrides")
			}
			if ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "laneway_epp" {
				t.Errorf("ext_proc talks to %v", ep.GetGrpcService())
			}
			if got := ep.GetMessageTimeout().AsDuration(); got != 120*time.Second {
				t.Errorf("message_timeout %v, want envoy.messageTimeout 120s", got)
			}
			if fwd := ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(); !slices.Equal(fwd, []string{extproc.MetadataNamespaceSubset, extproc.MetadataNamespaceLB}) {
				t.Errorf("forwarded metadata namespaces %v", fwd)
			}
			if rcv := ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(); !slices.Equal(rcv, []string{extproc.MetadataNamespaceLB}) {
				t.Errorf("received metadata namespaces %v", rcv)
			}

			ready := listeners["readiness"].GetHttpFilters()
			if len(ready) == 0 || ready[0].GetName() != "envoy.filters.http.health_check" {
				t.Fatalf("readiness listener filters %v, want health_check first", ready)
			}
			var hc healthcheckv3.HealthCheck
			unpackValid(t, "health_check filter", ready[0].GetTypedConfig(), &hc)
			if hc.GetPassThroughMode().GetValue() {
				t.Error("readiness health_check passes through; it must answer itself")
			}

			// The picker returns one endpoint for ORIGINAL_DST, and Envoy's
			// pod probes the readiness listener.
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "gw-laneway"))
			if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--header-pick-only") {
				t.Errorf("picker args %v lack --header-pick-only", dep.Spec.Template.Spec.Containers[0].Args)
			}
			envoy := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "gw-laneway-envoy"))
			probe := envoy.Spec.Template.Spec.Containers[0].ReadinessProbe
			if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/ready" || probe.HTTPGet.Port.String() != "http-ready" {
				t.Errorf("Envoy readiness probe %+v, want GET /ready on http-ready", probe)
			}
			if !strings.Contains(cm.Data["envoy.yaml"], "port_value: 19001") {
				t.Error("readiness listener is not on envoy.readinessPort 19001")
			}
		})
	}
}

// checkEnvoyClientCert: with envoy.clientCertSecret (secret) the picker
// cluster's TLS presents a certificate from file-based SDS whose resource
// file is in the ConfigMap and names the pair where the Deployment mounts
// that Secret, watched for the kubelet's symlink swap; without it no
// certificate is configured.
func checkEnvoyClientCert(t *testing.T, secret string, tc *tlsv3.CommonTlsContext, files map[string]string, envoy *appsv1.Deployment) {
	t.Helper()
	sds := tc.GetTlsCertificateSdsSecretConfigs()
	if secret == "" {
		if len(sds) != 0 || len(tc.GetTlsCertificates()) != 0 || files["sds-client-cert.yaml"] != "" {
			t.Errorf("a client certificate without envoy.clientCertSecret: %v %v", sds, tc.GetTlsCertificates())
		}
		return
	}
	if len(sds) != 1 {
		t.Fatalf("laneway_epp TLS certificate SDS configs %v, want one", sds)
	}
	src := sds[0].GetSdsConfig().GetPathConfigSource()
	const dir, file = "/etc/envoy", "sds-client-cert.yaml"
	if src.GetPath() != dir+"/"+file || src.GetWatchedDirectory().GetPath() != dir {
		t.Errorf("SDS source %v, want %s/%s watched in %s", src, dir, file, dir)
	}
	js, err := yaml.YAMLToJSON([]byte(files[file]))
	if err != nil {
		t.Fatalf("%s is not YAML: %v", file, err)
	}
	var resp discoveryv3.DiscoveryResponse
	if err := protojson.Unmarshal(js, &resp); err != nil {
		t.Fatalf("%s is not a v3 DiscoveryResponse: %v\n%s", file, err, files[file])
	}
	if len(resp.GetResources()) != 1 {
		t.Fatalf("%s holds %d resources, want the one secret", file, len(resp.GetResources()))
	}
	var sec tlsv3.Secret
	unpackValid(t, file, resp.GetResources()[0], &sec)
	if sec.GetName() != sds[0].GetName() {
		t.Errorf("SDS secret %q, the cluster asks for %q", sec.GetName(), sds[0].GetName())
	}
	var mount string
	for _, m := range envoy.Spec.Template.Spec.Containers[0].VolumeMounts {
		for _, v := range envoy.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == secret {
				if m.SubPath != "" || !m.ReadOnly {
					t.Errorf("client certificate mounted %+v: want the whole volume (a subPath sees no updates), read-only", m)
				}
				mount = m.MountPath
			}
		}
	}
	if mount == "" || strings.HasPrefix(mount, dir+"/") {
		t.Fatalf("Secret %s mounted at %q, want a directory of its own outside %s", secret, mount, dir)
	}
	cert := sec.GetTlsCertificate()
	if cert.GetCertificateChain().GetFilename() != mount+"/tls.crt" || cert.GetPrivateKey().GetFilename() != mount+"/tls.key" ||
		cert.GetWatchedDirectory().GetPath() != mount {
		t.Errorf("SDS certificate %v, want %s/tls.crt and tls.key, watched in %s", cert, mount, mount)
	}
}
