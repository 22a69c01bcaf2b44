"""One trainer of a streambatch split over Arrow Flight, which may go wrong
on purpose: reads its rank's epoch with the cluster's client certificate
and prints {"ids": [...], "error": ...} as JSON once it stops.

usage: trainer.py HOST:PORT TLS_DIR CERT_NAME TICKET HOW

HOW: `all` reads to the end; `kill-after:N` prints what it read after N
batches (confirmed, when confirming) and kills itself (SIGKILL: no goodbye
on the wire); `stall-after:N` prints after N batches, the last not
confirmed, and then sleeps, alive and silent. A TICKET ending
in /confirm is read confirming: after each batch the trainer sends the
`confirm` action with the batches read so far; "confirmed" says how many
of the ids printed it confirmed (the first ones).
"""
import faulthandler
import json
import os
import signal
import sys
import time

import pyarrow.flight as flight


def main():
    # A trainer the test gives up on shows where it was.
    faulthandler.dump_traceback_later(50)
    addr, tls, name, ticket, how = sys.argv[1:]
    read = lambda path: open(path, "rb").read()
    client = flight.FlightClient(
        f"grpc+tls://{addr}",
        tls_root_certs=read(f"{tls}/ca.pem"),
        cert_chain=read(f"{tls}/{name}.pem"),
        private_key=read(f"{tls}/{name}.key"),
        # The cluster's certificates name "streambatch", not a host.
        override_hostname="streambatch",
    )
    confirming = ticket.endswith("/confirm")
    key = ticket[: -len("/confirm")] if confirming else ticket
    mode, _, n = how.partition(":")
    stop_after = int(n) if n else None
    ids, error, batches, confirmed = [], None, 0, 0

    def report():
        out = {"ids": ids, "confirmed": confirmed, "error": error}
        print(json.dumps(out), flush=True)

    try:
        reader = client.do_get(flight.Ticket(ticket.encode()))
        for chunk in reader:
            ids.extend(chunk.data.column("id").to_pylist())
            batches += 1
            stops = stop_after is not None and batches >= stop_after
            if stops and mode == "stall-after":
                # Stuck with its last batch, before confirming it.
                report()
                time.sleep(3600)
            if confirming:
                body = f"{key}/{batches}".encode()
                list(client.do_action(flight.Action("confirm", body)))
                confirmed = len(ids)
            if stops:
                report()
                os.kill(os.getpid(), signal.SIGKILL)
    except Exception as e:  # reported to the test, which decides
        error = str(e)
    report()


main()
