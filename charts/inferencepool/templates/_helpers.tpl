{{/*
Names. The pool is named after the release unless inferencePool.name says otherwise; the EPP and
everything that belongs to it is "<pool>-epp", as in manifests/epp, so a kustomize install and a
Helm install of the same pool name the same objects.
*/}}
{{- define "inferencepool.poolName" -}}
{{- .Values.inferencePool.name | default .Release.Name | trunc 59 | trimSuffix "-" -}}
{{- end -}}

{{- define "inferencepool.eppName" -}}
{{- printf "%s-epp" (include "inferencepool.poolName" .) -}}
{{- end -}}

{{/* The peer exchange's TLS Secret: the one given, or the one the chart makes. */}}
{{- define "inferencepool.peerTlsSecret" -}}
{{- .Values.inferenceExtension.activeActive.tls.existingSecret | default (printf "%s-peer-tls" (include "inferencepool.eppName" .)) -}}
{{- end -}}

{{/* The DNS name every replica's peer certificate carries (epp serve checks it). */}}
{{- define "inferencepool.peerIdentity" -}}
{{- printf "%s.%s.epp-peers" (include "inferencepool.poolName" .) .Release.Namespace -}}
{{- end -}}

{{- define "inferencepool.poolGroup" -}}
{{- .Values.inferencePool.apiVersion | splitList "/" | first -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "inferencepool.labels" -}}
app.kubernetes.io/part-of: lora-epp
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The EPP's selector: stable across upgrades, so never the chart version. */}}
{{- define "inferencepool.eppSelectorLabels" -}}
app.kubernetes.io/name: lora-epp
app.kubernetes.io/instance: {{ include "inferencepool.eppName" . }}
{{- end -}}

{{- define "inferencepool.eppLabels" -}}
{{ include "inferencepool.eppSelectorLabels" . }}
{{ include "inferencepool.labels" . }}
app.kubernetes.io/version: {{ .Values.inferenceExtension.image.tag | default .Chart.AppVersion | quote }}
{{- end -}}

{{- define "inferencepool.image" -}}
{{- $image := .Values.inferenceExtension.image -}}
{{- $tag := $image.tag | default .Chart.AppVersion -}}
{{- if $image.hub -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $image.hub) $image.name $tag -}}
{{- else -}}
{{- printf "%s:%s" $image.name $tag -}}
{{- end -}}
{{- end -}}

{{/* How the replicas share the pool: single, activePassive (leader election) or activeActive. */}}
{{- define "inferencepool.haMode" -}}
{{- if .Values.inferenceExtension.activeActive.enabled -}}
activeActive
{{- else if gt (int .Values.inferenceExtension.replicas) 1 -}}
activePassive
{{- else -}}
single
{{- end -}}
{{- end -}}

{{/*
What values.schema.json cannot say: checks that span several values. Each fails the render with
a message that names the value to change.
*/}}
{{- define "inferencepool.validate" -}}
{{- $ext := .Values.inferenceExtension -}}
{{- if not .Values.inferencePool.modelServers.matchLabels -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels of the model server pods, e.g. --set inferencePool.modelServers.matchLabels.app=vllm" -}}
{{- end -}}
{{- if and $ext.activeActive.enabled (lt (int $ext.replicas) 2) -}}
{{- fail "inferenceExtension.activeActive.enabled needs inferenceExtension.replicas of 2 or more" -}}
{{- end -}}
{{- if and $ext.pluginsConfigFile (not (hasKey $ext.pluginsCustomConfig $ext.pluginsConfigFile)) -}}
{{- fail (printf "inferenceExtension.pluginsConfigFile %q is not a key of inferenceExtension.pluginsCustomConfig" $ext.pluginsConfigFile) -}}
{{- end -}}
{{- if and $ext.pluginsCustomConfig (not $ext.pluginsConfigFile) (gt (len $ext.pluginsCustomConfig) 1) -}}
{{- fail "inferenceExtension.pluginsCustomConfig holds several files: set inferenceExtension.pluginsConfigFile to the one epp serve reads" -}}
{{- end -}}
{{- if and (or .Values.gateway.create .Values.httpRoute.enabled) (eq .Values.provider.name "none") -}}
{{- fail "gateway.create and httpRoute.enabled need provider.name (istio, kgateway or envoy-gateway)" -}}
{{- end -}}
{{- range $flag, $_ := $ext.flags -}}
{{- if has $flag (list "pool-name" "pool-namespace" "pool-group" "config-file" "peers" "peer-port" "grpc-port" "grpc-health-port" "metrics-port" "ha-enable-leader-election" "secure-serving" "tracing") -}}
{{- fail (printf "inferenceExtension.flags.%s is set by the chart; use the value that controls it (see the chart's README)" $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The plugin file `epp serve --config-file` reads, when there is one. */}}
{{- define "inferencepool.configFile" -}}
{{- $ext := .Values.inferenceExtension -}}
{{- if $ext.pluginsConfigFile -}}
{{- $ext.pluginsConfigFile -}}
{{- else if $ext.pluginsCustomConfig -}}
{{- keys $ext.pluginsCustomConfig | first -}}
{{- end -}}
{{- end -}}
