{{/*
Labels every object carries, as in deploy/kustomize/base (k8s-app: flannel on all of them;
tier and app on the ConfigMap and the DaemonSet, whose pods are selected by app: flannel
alone, like Go flannel's chart and plain manifest).
*/}}
{{- define "pyflannel.labels" -}}
k8s-app: flannel
{{- end }}

{{- define "pyflannel.nodeLabels" -}}
tier: node
k8s-app: flannel
app: flannel
{{- end }}

{{- define "pyflannel.image" -}}
{{ .repository }}:{{ .tag }}
{{- end }}

{{/*
net-conf.json, built as a map and serialised by toPrettyJson, so every value is quoted as
JSON needs whatever the values hold. The members each flannel.* key sets, per backend, are
those of Go flannel's chart; a key at 0, "" or false sets nothing.
*/}}
{{- define "pyflannel.netConf" -}}
{{- $f := .Values.flannel -}}
{{- $conf := dict -}}
{{- if .Values.podCidr }}
{{- $_ := set $conf "Network" (toString .Values.podCidr) }}
{{- else }}
{{- $_ := set $conf "EnableIPv4" false }}
{{- end }}
{{- if .Values.podCidrv6 }}
{{- $_ := set $conf "IPv6Network" (toString .Values.podCidrv6) }}
{{- $_ := set $conf "EnableIPv6" true }}
{{- end }}
{{- $_ := set $conf "EnableNFTables" (eq (toString $f.enableNFTables) "true") }}
{{- $named := dict }}
{{- if eq $f.backend "vxlan" }}
{{- if $f.backendPort }}{{ $_ := set $named "Port" (int64 $f.backendPort) }}{{ end }}
{{- if $f.vni }}{{ $_ := set $named "VNI" (int64 $f.vni) }}{{ end }}
{{- if eq (toString $f.GBP) "true" }}{{ $_ := set $named "GBP" true }}{{ end }}
{{- if eq (toString $f.directRouting) "true" }}{{ $_ := set $named "DirectRouting" true }}{{ end }}
{{- if $f.mtu }}{{ $_ := set $named "MTU" (int64 $f.mtu) }}{{ end }}
{{- if $f.macPrefix }}{{ $_ := set $named "MacPrefix" (toString $f.macPrefix) }}{{ end }}
{{- else if eq $f.backend "wireguard" }}
{{- if $f.backendPort }}{{ $_ := set $named "ListenPort" (int64 $f.backendPort) }}{{ end }}
{{- if $f.backendPortv6 }}{{ $_ := set $named "ListenPortV6" (int64 $f.backendPortv6) }}{{ end }}
{{- if $f.psk }}{{ $_ := set $named "PSK" (toString $f.psk) }}{{ end }}
{{- if $f.mtu }}{{ $_ := set $named "MTU" (int64 $f.mtu) }}{{ end }}
{{- if $f.tunnelMode }}{{ $_ := set $named "Mode" (toString $f.tunnelMode) }}{{ end }}
{{- if $f.keepaliveInterval }}
{{- $_ := set $named "PersistentKeepaliveInterval" (int64 $f.keepaliveInterval) }}
{{- end }}
{{- else if eq $f.backend "ipsec" }}
{{- if $f.psk }}{{ $_ := set $named "PSK" (toString $f.psk) }}{{ end }}
{{- else if eq $f.backend "udp" }}
{{- if $f.backendPort }}{{ $_ := set $named "Port" (int64 $f.backendPort) }}{{ end }}
{{- end }}
{{- $backend := dict "Type" $f.backend }}
{{- range $key, $value := ($f.backendConfig | default dict) }}
{{- if eq (lower $key) "type" }}
{{- fail (printf "flannel.backendConfig.%s: the backend type is flannel.backend" $key) }}
{{- end }}
{{- range $set := keys $named }}
{{- if eq (lower $key) (lower $set) }}
{{- fail (printf "flannel.backendConfig.%s: %s is already set from the flannel.* values; set it in one place only" $key $set) }}
{{- end }}
{{- end }}
{{- $_ := set $backend $key $value }}
{{- end }}
{{- $_ := set $conf "Backend" (merge $backend $named) }}
{{- toPrettyJson $conf }}
{{- end }}

{{/*
The CNI conflist, refused here when it is not a JSON object: a broken conflist would
otherwise reach every node and leave kubelet without a network.
*/}}
{{- define "pyflannel.cniConf" -}}
{{- $conf := .Values.flannel.cniConf }}
{{- $parsed := fromJson $conf }}
{{- if or (not $parsed) (hasKey $parsed "Error") }}
{{- fail "flannel.cniConf is not a JSON object: give the CNI network config list as JSON text" }}
{{- end }}
{{- $conf }}
{{- end }}
