"""Reads the Prometheus text exposition format on stdin with the official client's parser
(``prometheus_client.parser``) and prints the families as JSON: a list of
``{"name", "type", "help", "samples": [{"name", "labels", "value"}]}``. Used by the metrics
tests, so that what ``GET /metrics`` serves is read by a real parser, not by the code that
wrote it."""
import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> None:
    families = []
    for family in text_string_to_metric_families(sys.stdin.read()):
        families.append({
            "name": family.name,
            "type": family.type,
            "help": family.documentation,
            "samples": [
                {
                    "name": s.name,
                    "labels": s.labels,
                    "value": s.value if math.isfinite(s.value) else str(s.value),
                }
                for s in family.samples
            ],
        })
    json.dump(families, sys.stdout)


if __name__ == "__main__":
    main()
