{{/*
Names. Every object of a release is prefixed with laneway.fullname; the
picker's Service carries the full name itself, because the InferencePool's
endpointPickerRef and the Envoy configuration point at it.
*/}}
{{- define "laneway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "laneway.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "laneway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Envoy data plane's objects. */}}
{{- define "laneway.envoyName" -}}
{{- printf "%s-envoy" (include "laneway.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* The InferencePool the picker serves. */}}
{{- define "laneway.poolName" -}}
{{- default (include "laneway.fullname" .) .Values.inferencePool.name }}
{{- end }}

{{/* The pool's leader-election Lease (internal/ha LeaseName). */}}
{{- define "laneway.leaseName" -}}
laneway-epp-{{ include "laneway.poolName" . }}
{{- end }}

{{/*
The Secret holding the replica identity (leader election): the user's, or
the one the chart provisions (generated, or issued by cert-manager).
*/}}
{{- define "laneway.replicaSecret" -}}
{{- default (printf "%s-replica" (include "laneway.fullname" .)) .Values.epp.replicaIdentity.secret }}
{{- end }}

{{- define "laneway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "laneway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "laneway.labels" -}}
helm.sh/chart: {{ include "laneway.chart" . }}
app.kubernetes.io/name: {{ include "laneway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: laneway
{{- end }}

{{/* Selector labels of the picker's pods. */}}
{{- define "laneway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "laneway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{/* Selector labels of the Envoy pods. */}}
{{- define "laneway.envoySelectorLabels" -}}
app.kubernetes.io/name: {{ include "laneway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: envoy
{{- end }}

{{/*
Leader election: "auto" follows the replica count. Two active pickers would
each hold their own queue and split every class's share, so "disabled" with
more than one replica is refused rather than rendered.
*/}}
{{- define "laneway.leaderElection" -}}
{{- $mode := .Values.epp.leaderElection }}
{{- $replicas := int .Values.epp.replicas }}
{{- if eq $mode "enabled" }}true
{{- else if eq $mode "disabled" }}
{{- if gt $replicas 1 }}
{{- fail (printf "epp.leaderElection is \"disabled\" with epp.replicas %d: replicas without leader election would each run their own queue and split the classes' shares; use \"auto\" or one replica" $replicas) }}
{{- end }}false
{{- else if gt $replicas 1 }}true
{{- else }}false
{{- end }}
{{- end }}

{{/* The epp image reference. */}}
{{- define "laneway.eppImage" -}}
{{- printf "%s:%s" .Values.epp.image.repository (default .Chart.AppVersion .Values.epp.image.tag) }}
{{- end }}

{{/*
A DNS-1123 object name for a policy class: <pool>[-<model>]-<class>,
lowercased, other characters as '-'. Called with (dict "pool" "model"
"class").
*/}}
{{- define "laneway.classObjectName" -}}
{{- $parts := list .pool }}
{{- if .model }}{{- $parts = append $parts .model }}{{- end }}
{{- $parts = append $parts .class }}
{{- $raw := join "-" $parts | lower }}
{{- regexReplaceAll "[^a-z0-9.-]" $raw "-" | trunc 200 | trimSuffix "-" | trimSuffix "." }}
{{- end }}

{{/*
The request headers the chart's Envoy removes from what clients send, as a
JSON list: none without policy.profile.identity; with it, the identity
header and x-laneway-tenant, and unless envoy.stripClientHints is false the
class and priority headers too (SPEC §6, §14). It also checks the identity
and JWT values that only make sense together.
*/}}
{{- define "laneway.strippedHeaders" -}}
{{- $identity := dig "identity" dict .Values.policy.profile }}
{{- $jwt := .Values.envoy.jwt }}
{{- if $jwt.provider }}
{{- if and $jwt.remoteJwksUri $jwt.localJwks }}
{{- fail "envoy.jwt: set remoteJwksUri or localJwks, not both" }}
{{- else if not (or $jwt.remoteJwksUri $jwt.localJwks) }}
{{- fail "envoy.jwt: a provider needs its keys: set remoteJwksUri or localJwks" }}
{{- end }}
{{- if not $jwt.issuer }}
{{- fail "envoy.jwt: set issuer (the iss claim the tokens carry)" }}
{{- end }}
{{- with $identity.metadata }}
{{- if and (eq .namespace "envoy.filters.http.jwt_authn") (ne (first .path) $jwt.provider) }}
{{- fail (printf "policy.profile.identity.metadata.path starts with %q, but the chart's jwt_authn writes the payload under envoy.jwt.provider %q: use path [%s, <claim>]" (first .path) $jwt.provider $jwt.provider) }}
{{- end }}
{{- end }}
{{- end }}
{{- $strip := list }}
{{- if $identity }}
{{- with $identity.header }}{{ $strip = append $strip . }}{{ end }}
{{- end }}
{{- if or $identity (not .Values.trustClientHints) }}
{{- $strip = append $strip "x-laneway-tenant" }}
{{- end }}
{{- if and .Values.envoy.stripClientHints (or $identity (not .Values.trustClientHints)) }}
{{- $strip = concat $strip (list "x-laneway-policy-class" "x-dynamo-meta-policy-class" "x-laneway-priority" "x-laneway-strict-priority" "x-dynamo-request-priority" "x-dynamo-request-strict-priority") }}
{{- end }}
{{- uniq $strip | toJson }}
{{- end }}

{{/*
Mutual TLS checks, rendered nowhere: a client CA needs TLS, comes from one
source, and the chart's own Envoy must then present a certificate, or it
could never reach the picker.
*/}}
{{- define "laneway.validateMutualTLS" -}}
{{- $ca := .Values.epp.clientCA }}
{{- if and $ca.secret $ca.configMap }}
{{- fail (printf "epp.clientCA: give secret (%q) or configMap (%q), not both" $ca.secret $ca.configMap) }}
{{- end }}
{{- if and (or $ca.secret $ca.configMap) (not .Values.epp.secureServing) }}
{{- fail "epp.clientCA needs epp.secureServing: client certificates are part of TLS" }}
{{- end }}
{{- if and .Values.envoy.enabled .Values.envoy.clientCertSecret (not .Values.epp.secureServing) }}
{{- fail "envoy.clientCertSecret needs epp.secureServing: Envoy presents its certificate in the TLS handshake with the picker" }}
{{- end }}
{{- if and .Values.envoy.enabled (or $ca.secret $ca.configMap) (not .Values.envoy.clientCertSecret) }}
{{- fail "envoy.clientCertSecret is empty but epp.clientCA is set: the picker would refuse the chart's Envoy, which presents no client certificate; name a kubernetes.io/tls Secret signed by the client CA" }}
{{- end }}
{{- end }}

{{/* The --client-ca path inside the picker's container, or "". */}}
{{- define "laneway.clientCAPath" -}}
{{- $ca := .Values.epp.clientCA }}
{{- if or $ca.secret $ca.configMap }}/etc/laneway/client-ca/{{ $ca.key }}{{ end }}
{{- end }}
