"""Reads every rank of a streambatch split over Arrow Flight, one thread
per rank (an epoch starts once every rank has asked), with a client
certificate of the cluster; prints {rank: [ids]} as JSON.

usage: read_split.py HOST:PORT TLS_DIR CERT_NAME EPOCH TICKET...
"""
import json
import sys
import threading

import pyarrow.flight as flight


def main():
    addr, tls, name, epoch, *tickets = sys.argv[1:]
    read = lambda path: open(path, "rb").read()

    def client():
        return flight.FlightClient(
            f"grpc+tls://{addr}",
            tls_root_certs=read(f"{tls}/ca.pem"),
            cert_chain=read(f"{tls}/{name}.pem"),
            private_key=read(f"{tls}/{name}.key"),
            # The cluster's certificates name "streambatch", not a host.
            override_hostname="streambatch",
        )

    out, errors = {}, {}

    def take(rank, ticket):
        try:
            table = client().do_get(flight.Ticket(ticket.encode())).read_all()
            out[rank] = table.column("id").to_pylist()
        except Exception as e:  # reported to the test, which decides
            errors[rank] = str(e)

    threads = [
        threading.Thread(target=take, args=(rank, ticket))
        for rank, ticket in enumerate(tickets)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"epoch": int(epoch), "ids": out, "errors": errors}))


main()
