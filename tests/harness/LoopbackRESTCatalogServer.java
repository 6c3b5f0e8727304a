// Test harness: Apache Iceberg's REST catalog fixture (the reference REST
// server of iceberg-open-api's test fixtures, 1.10.0), bound to loopback.
//
// Iceberg's own main class, RESTCatalogServer, listens on ALL interfaces
// (`new Server(port)`). This class builds the same server from the same
// pieces (RCKUtils's CATALOG_* environment variables, the backend catalog,
// RESTServerCatalogAdapter, RESTCatalogServlet, gzip) on a jetty connector
// bound to 127.0.0.1. It lives in Iceberg's package because those pieces
// are package-private there. Compiled by tests/harness/iceberg-rest-fetch.
//
// Configuration, as the fixture's: CATALOG_* environment variables (prefix
// dropped, `__` -> `-`, `_` -> `.`, lower case), e.g. CATALOG_WAREHOUSE,
// CATALOG_URI (a JDBC URL), CATALOG_CATALOG__IMPL, CATALOG_IO__IMPL,
// CATALOG_INCLUDE__CREDENTIALS. The port is CATALOG_REST_PORT; 0 (the
// default here) lets the system pick a free one. Once it listens, prints
// `listening on 127.0.0.1:<port>` as one line on stdout; logs go to stderr.
package org.apache.iceberg.rest;

import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.relocated.com.google.common.collect.Maps;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class LoopbackRESTCatalogServer {
  public static void main(String[] args) throws Exception {
    Map<String, String> properties = Maps.newHashMap(RCKUtils.environmentCatalogConfig());
    // The fixture's own defaults.
    properties.putIfAbsent(
        CatalogProperties.CATALOG_IMPL, "org.apache.iceberg.jdbc.JdbcCatalog");
    properties.putIfAbsent(CatalogProperties.URI, "jdbc:sqlite::memory:");
    properties.putIfAbsent("jdbc.schema-version", "V1");
    if (!properties.containsKey(CatalogProperties.WAREHOUSE_LOCATION)) {
      System.err.println("LoopbackRESTCatalogServer: set CATALOG_WAREHOUSE");
      System.exit(2);
    }
    int port = Integer.parseInt(properties.getOrDefault(RESTCatalogServer.REST_PORT, "0"));

    Catalog backend =
        CatalogUtil.buildIcebergCatalog("rest_backend", properties, new Configuration());
    RESTCatalogAdapter adapter =
        new RESTServerCatalogAdapter(new RESTCatalogServer.CatalogContext(backend, properties));
    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    context.insertHandler(new GzipHandler());

    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost("127.0.0.1");
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    System.out.println("listening on 127.0.0.1:" + connector.getLocalPort());
    System.out.flush();
    server.join();
  }
}
