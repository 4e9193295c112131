"""Who a client is and what it may do, after Kafka's security: SASL mechanisms (PLAIN and
SCRAM) as pure state machines, the principal a TLS client certificate names, and the
authorizer (ACLs after Kafka's StandardAuthorizer). Nothing here touches sockets or the broker;
the asyncio shell holds each connection's session, the broker the authorizer and the stores.
"""
