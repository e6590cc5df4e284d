"""Builds the four otelbpf Grafana dashboards with grafana-foundation-sdk.

    python deploy/compose/grafana/dashboards.py          # (re)writes dashboards/*.json
    python deploy/compose/grafana/dashboards.py --check  # exit 1 if the files are stale

The JSON files are committed (Grafana provisions them from deploy/compose/grafana/dashboards/,
and they import into any Grafana); tests/deploy checks they are what this script writes, that
every PromQL query parses and names only metrics and labels a real otelbpf run exports, and
that every TraceQL attribute exists on real spans.

Metric names are OTLP names as the Collector's `prometheus` exporter writes them (dots to
underscores, the unit as a suffix, `_total` on counters; resource attributes as labels with
`resource_to_telemetry_conversion`): the mapping is in README.md's Deploy section. Data
sources are referenced by the uids deploy/compose/grafana/provisioning/datasources provisions:
`prometheus`, `tempo`, `pyroscope`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, table, tempo, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

OUT = Path(__file__).resolve().parent / "dashboards"
PROM = DataSourceRef(type_val="prometheus", uid="prometheus")
TEMPO = DataSourceRef(type_val="tempo", uid="tempo")
RATE = "$__rate_interval"
#: The watched processes' services; otelbpf's own metrics carry service_name="otelbpf".
SVC = 'service_name=~"$service"'


def promql(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(PROM)


def series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12,
           description: str = "") -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(PROM).height(8).span(width)
    if description:
        panel = panel.description(description)
    for q in queries:
        panel = panel.with_target(q)
    return panel


def bars(title: str, unit: str, query: prometheus.Dataquery, width: int = 12) -> bargauge.Panel:
    return (bargauge.Panel().title(title).unit(unit).datasource(PROM).height(8).span(width)
            .with_target(query.instant()))


def traces(title: str, traceql: str, width: int = 24) -> table.Panel:
    query = tempo.TempoQuery().query(traceql).query_type("traceql").limit(20).ref_id("A").datasource(TEMPO)
    return table.Panel().title(title).datasource(TEMPO).height(8).span(width).with_target(query)


def quantiles(metric: str, by: str, selector: str = SVC) -> list[prometheus.Dataquery]:
    """p50 and p99 of a histogram, per `by` labels."""
    return [promql(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
                   f"p{int(q * 100)} " + " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(",")), ref)
            for q, ref in ((0.5, "A"), (0.99, "B"))]


def base(uid: str, title: str, description: str, service_metric: str | None) -> dashboard.Dashboard:
    """A dashboard; with `service_metric`, a $service variable listing that metric's services."""
    board = (dashboard.Dashboard(title).uid(uid).description(description).tags(["otelbpf", "ebpf"])
             .time("now-30m", "now").refresh("30s").editable())
    if service_metric is None:
        return board
    return board.with_variable(
        dashboard.QueryVariable("service").label("service").datasource(PROM)
        .query(f"label_values({service_metric}, service_name)").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True).include_all(True).all_value(".*"))


def gpu() -> dashboard.Dashboard:
    return (base("otelbpf-gpu", "otelbpf / GPU (CUDA)",
                 "CUDA runtime and driver calls seen by otelbpf's uprobes: launches, copies, syncs, memory.",
                 "cuda_kernel_launches_total")
            .with_row(dashboard.Row("Kernel launches"))
            .with_panel(series("Launches/s by API function", "ops", promql(
                f"sum by (service_name, cuda_api_function) (rate(cuda_kernel_launches_total{{{SVC}}}[{RATE}]))",
                "{{service_name}} {{cuda_api_function}}"), description="Every launch, counted in the kernel."))
            .with_panel(bars("Launches by kernel (top kernels per process)", "short", promql(
                f"topk(15, sum by (cuda_kernel_name) (cuda_kernel_launches_top{{{SVC}}}))", "{{cuda_kernel_name}}")))
            .with_row(dashboard.Row("Copies"))
            .with_panel(series("Copy bytes/s by direction", "Bps", promql(
                f"sum by (cuda_memcpy_direction) (rate(cuda_memcpy_bytes_total{{{SVC}}}[{RATE}]))",
                "{{cuda_memcpy_direction}}")))
            .with_panel(series("Host copies: pinned vs pageable", "Bps", promql(
                f"sum by (cuda_memcpy_direction, cuda_memcpy_host_memory) "
                f"(rate(cuda_memcpy_host_bytes_total{{{SVC}}}[{RATE}]))",
                "{{cuda_memcpy_direction}} {{cuda_memcpy_host_memory}}"),
                description="Pageable copies are staged through a pinned buffer by the driver: slower."))
            .with_row(dashboard.Row("Synchronization and memory"))
            .with_panel(series("Sync waits p50 / p99", "s", *quantiles("cuda_sync_duration_seconds", "cuda_api_function"),
                               description="How long host threads waited in stream/device/event synchronize."))
            .with_panel(series("Device memory in use", "bytes",
                               promql(f"sum by (service_name, process_pid) (cuda_memory_in_use_bytes{{{SVC}}})",
                                      "{{service_name}} pid {{process_pid}}"),
                               promql(f"max by (service_name) (cuda_memory_high_water_bytes{{{SVC}}})",
                                      "high water {{service_name}}", "B")))
            .with_panel(series("CUDA API calls/s", "ops", promql(
                f"sum by (cuda_api_function) (rate(cuda_api_calls_total{{{SVC}}}[{RATE}]))", "{{cuda_api_function}}")))
            .with_panel(traces("Requests that made CUDA calls (Tempo)",
                               '{ kind = server } >> { span.cuda.api.function =~ "cudaMemcpy.*" }', width=12)))


def nccl() -> dashboard.Dashboard:
    by_rank = "host_name, process_pid"
    # per rank and communicator across nodes, as deploy/prometheus/otelbpf-nccl.rules.yaml reads it
    fleet = "nccl_comm_id, nccl_rank, host_name"
    rank_wait = (f"(sum by ({fleet}) (rate(nccl_collective_wait_seconds_sum{{{SVC}}}[{RATE}])) "
                 f"/ sum by ({fleet}) (rate(nccl_collective_wait_seconds_count{{{SVC}}}[{RATE}])))")
    return (base("otelbpf-nccl", "otelbpf / NCCL",
                 "NCCL collectives per rank (each rank is a process: host and pid) and live straggler findings.",
                 "nccl_collectives_total")
            .with_panel(series("Collective wait p50 / p99 by rank", "s",
                               *quantiles("nccl_wait_duration_seconds", f"{by_rank}, nccl_op"),
                               description="From enqueue to the synchronize that observed completion."))
            .with_panel(series("Collectives/s by rank", "ops", promql(
                f"sum by ({by_rank}, nccl_op) (rate(nccl_collectives_total{{{SVC}}}[{RATE}]))",
                "{{host_name}} pid {{process_pid}} {{nccl_op}}")))
            .with_panel(series("Bytes/s by operation", "Bps", promql(
                f"sum by (nccl_op) (rate(nccl_bytes_total{{{SVC}}}[{RATE}]))", "{{nccl_op}}")))
            .with_panel(series("Algorithm bandwidth p50 (host view)", "Bps", promql(
                f"histogram_quantile(0.5, sum by (le, nccl_op) "
                f"(rate(nccl_algorithm_bandwidth_bytes_per_second_bucket{{{SVC}}}[{RATE}])))", "{{nccl_op}}")))
            .with_row(dashboard.Row("Stragglers"))
            .with_panel(series("Mean collective wait by rank, every node", "s", promql(
                rank_wait, "{{host_name}} rank {{nccl_rank}} comm {{nccl_comm_id}}"),
                description="Arrival at a collective to its completion, per rank and communicator "
                            "(nccl.collective.wait). The rank the others wait for waits least: no clock, "
                            "no alignment (docs/stragglers.md)."))
            .with_panel(bars("Straggler: wait deficit against the communicator's median rank", "s", promql(
                f"sort_desc(quantile by (nccl_comm_id) (0.5, {rank_wait}) "
                f"- on (nccl_comm_id) group_right () {rank_wait})",
                "{{host_name}} rank {{nccl_rank}} comm {{nccl_comm_id}}")))
            .with_panel(bars("Straggler collectives by rank and class", "short", promql(
                f"sum by ({by_rank}, nccl_straggler_class) (increase(nccl_straggler_total{{{SVC}}}[$__range]))",
                "{{host_name}} pid {{process_pid}} {{nccl_straggler_class}}")))
            .with_panel(series("Straggler lateness p99", "s", promql(
                f"histogram_quantile(0.99, sum by (le, {by_rank}, nccl_straggler_class) "
                f"(rate(nccl_straggler_lateness_seconds_bucket{{{SVC}}}[{RATE}])))",
                "{{host_name}} pid {{process_pid}} {{nccl_straggler_class}}")))
            .with_panel(traces("Collectives a rank straggled on (Tempo)",
                               '{ span.nccl.op != nil && event:name = "nccl.straggler" }')))


def http() -> dashboard.Dashboard:
    server = "http_server_request_duration_seconds"
    return (base("otelbpf-http", "otelbpf / HTTP and gRPC (RED)",
                 "Requests seen on sockets by otelbpf's http receiver: rate, errors, duration.",
                 f"{server}_count")
            .with_row(dashboard.Row("HTTP server"))
            .with_panel(series("Requests/s by method and status class", "reqps", promql(
                f"sum by (service_name, http_request_method, http_response_status_class) "
                f"(rate({server}_count{{{SVC}}}[{RATE}]))",
                "{{service_name}} {{http_request_method}} {{http_response_status_class}}"), width=8))
            .with_panel(series("Error ratio", "percentunit", promql(
                f'sum by (service_name) (rate({server}_count{{{SVC}, error_type!=""}}[{RATE}])) '
                f"/ sum by (service_name) (rate({server}_count{{{SVC}}}[{RATE}]))", "{{service_name}}"), width=8))
            .with_panel(series("Duration p50 / p99", "s", *quantiles(server, "service_name, http_request_method"),
                               width=8))
            .with_row(dashboard.Row("gRPC server, by route"))
            .with_panel(series("Calls/s by route and status", "reqps", promql(
                f"sum by (rpc_service, rpc_method, rpc_grpc_status_code) "
                f"(rate(rpc_server_duration_seconds_count{{{SVC}}}[{RATE}]))",
                "/{{rpc_service}}/{{rpc_method}} {{rpc_grpc_status_code}}"), width=8))
            .with_panel(series("Error ratio by route", "percentunit", promql(
                f'sum by (rpc_service, rpc_method) (rate(rpc_server_duration_seconds_count{{{SVC}, rpc_grpc_status_code!="0"}}[{RATE}])) '
                f"/ sum by (rpc_service, rpc_method) (rate(rpc_server_duration_seconds_count{{{SVC}}}[{RATE}]))",
                "/{{rpc_service}}/{{rpc_method}}"), width=8))
            .with_panel(series("Duration p50 / p99 by route", "s",
                               *quantiles("rpc_server_duration_seconds", "rpc_service, rpc_method"), width=8))
            .with_row(dashboard.Row("Outgoing calls"))
            .with_panel(series("HTTP client requests/s by status class", "reqps", promql(
                f"sum by (service_name, http_response_status_class) "
                f"(rate(http_client_request_duration_seconds_count{{{SVC}}}[{RATE}]))",
                "{{service_name}} {{http_response_status_class}}")))
            .with_panel(series("gRPC client p99 by route", "s", promql(
                f"histogram_quantile(0.99, sum by (le, rpc_service, rpc_method) "
                f"(rate(rpc_client_duration_seconds_bucket{{{SVC}}}[{RATE}])))", "/{{rpc_service}}/{{rpc_method}}")))
            .with_panel(traces("Slowest server requests (Tempo)",
                               "{ kind = server && span.http.request.method != nil } | select(span.url.path)")))


def agent() -> dashboard.Dashboard:
    me = 'service_name="otelbpf"'
    return (base("otelbpf-agent", "otelbpf / agent health",
                 "The agent's own otelbpf.* metrics: every drop is counted somewhere here.", None)
            .with_panel(series("Events received/s by ring", "ops", promql(
                f"sum by (host_name, ring) (rate(otelbpf_events_received_total{{{me}}}[{RATE}]))",
                "{{host_name}} {{ring}}")))
            .with_panel(series("Drops/s", "ops",
                               promql(f"sum by (host_name, reason) (rate(otelbpf_events_lost_total{{{me}}}[{RATE}]))",
                                      "lost in kernel: {{reason}}"),
                               promql(f"sum by (host_name, signal, reason) "
                                      f"(rate(otelbpf_export_dropped_total{{{me}}}[{RATE}]))",
                                      "export dropped: {{signal}} {{reason}}", "B"),
                               promql(f"sum by (host_name, receiver) (rate(otelbpf_spans_sampled_out_total{{{me}}}[{RATE}]))",
                                      "sampled out: {{receiver}}", "C"),
                               promql(f"sum by (host_name, ring) (rate(otelbpf_events_skipped_total{{{me}}}[{RATE}]))",
                                      "skipped: {{ring}}", "D"),
                               description="Non-zero lines say what to raise: ring_buffer_size, max_queue_size, "
                                           "max_spans_per_second (otelbpf/config/otelbpf.yaml)."))
            .with_panel(series("HTTP requests traced as spans (head sampling)", "percentunit", promql(
                f'sum by (host_name) (rate(otelbpf_http_sampled_total{{{me}, decision="kept"}}[{RATE}])) '
                f'/ sum by (host_name) (rate(otelbpf_http_sampled_total{{{me}, decision!="red_map_full"}}[{RATE}]))',
                "{{host_name}}"),
                description="The share of HTTP/1 requests kept as spans; the rest are counted in the kernel, so "
                            "request rates and durations stay exact (docs/semantic-conventions.md)."))
            .with_panel(series("Export: sent and failed per second", "ops",
                               promql(f"sum by (signal, exporter) (rate(otelbpf_export_sent_total{{{me}}}[{RATE}]))",
                                      "sent {{signal}} {{exporter}}"),
                               promql(f"sum by (signal, exporter) (rate(otelbpf_export_failures_total{{{me}}}[{RATE}]))",
                                      "failed {{signal}} {{exporter}}", "B")))
            .with_panel(series("Span queue depth", "short", promql(
                f"sum by (host_name) (otelbpf_spans_queued{{{me}}})", "{{host_name}}")))
            .with_panel(series("Agent CPU (cores)", "short", promql(
                f"sum by (host_name, cpu_mode) (rate(process_cpu_time_seconds_total{{{me}}}[{RATE}]))",
                "{{host_name}} {{cpu_mode}}")))
            .with_panel(series("Agent RSS", "bytes", promql(
                f"max by (host_name) (process_memory_usage_bytes{{{me}}})", "{{host_name}}")))
            .with_panel(series("Probes and libraries attached", "short",
                               promql(f"sum by (host_name) (otelbpf_probes_attached{{{me}}})", "probes {{host_name}}"),
                               promql(f"sum by (host_name) (otelbpf_libraries_attached{{{me}}})",
                                      "libraries {{host_name}}", "B"),
                               promql(f"sum by (host_name) (increase(otelbpf_attach_failures_total{{{me}}}[{RATE}]))",
                                      "attach failures {{host_name}}", "C")))
            .with_panel(bars("Start-up time by phase", "s", promql(
                f"max by (host_name, phase) (otelbpf_startup_duration_seconds{{{me}}})", "{{host_name}} {{phase}}"))))


DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "otelbpf-gpu.json": gpu, "otelbpf-nccl.json": nccl, "otelbpf-http.json": http, "otelbpf-agent.json": agent,
}


def render() -> dict[str, str]:
    """File name -> the dashboard's JSON text, as written to disk."""
    return {name: json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
            for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or --check) the otelbpf Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale dashboards (run {Path(__file__).name}): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
