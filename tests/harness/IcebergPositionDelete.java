// Test harness: another engine's row-level delete. Deletes the rows of an
// Iceberg table whose integer key is among the given keys, the way Spark's
// merge-on-read DELETE does it: ONE Parquet position-delete file (file_path,
// pos) naming every data file that holds such a row, so it names no single
// referenced data file, committed as a row delta. Written and committed by
// Apache Iceberg's own Java library (Parquet.writeDeletes, JdbcCatalog) on
// the SQLite catalog urutau's sink uses, as a second writer of the table.
//
//   java -cp LIB/*:CLASSES IcebergPositionDelete <catalog.db> <warehouse>
//        <catalog name> <namespace> <table> <key column> <key>...
//
// Prints one JSON object: "data_files" (how many data files the delete
// file names), "deleted" (rows), "delete_file" (its path) and
// "referenced_data_file" (what Iceberg recorded as the one file it
// references, null when it names several).
//
// Files go through IcebergRead.LocalFileIO (local paths; no Hadoop file
// system).

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.UUID;

import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.parquet.GenericParquetReaders;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.parquet.Parquet;

public class IcebergPositionDelete {
  private record Hit(String path, long pos) {}

  public static void main(String[] args) throws Exception {
    if (args.length < 7) {
      System.err.println(
          "usage: IcebergPositionDelete <catalog.db> <warehouse> <catalog name> <namespace> <table> <key column> <key>...");
      System.exit(2);
    }
    String keyColumn = args[5];
    Set<Long> keys = new HashSet<>();
    for (int i = 6; i < args.length; i++) {
      keys.add(Long.parseLong(args[i]));
    }
    Map<String, String> properties = new HashMap<>();
    properties.put(CatalogProperties.URI, "jdbc:sqlite:" + args[0]);
    properties.put(CatalogProperties.WAREHOUSE_LOCATION, args[1]);
    properties.put(CatalogProperties.FILE_IO_IMPL, IcebergRead.LocalFileIO.class.getName());
    properties.put("jdbc.schema-version", "V1");
    JdbcCatalog catalog = new JdbcCatalog();
    catalog.initialize(args[2], properties);
    Table table = catalog.loadTable(TableIdentifier.of(Namespace.of(args[3]), args[4]));

    // Every live data file, read in file order: a row's position is its
    // index in the file.
    Schema keySchema = table.schema().select(keyColumn);
    List<Hit> hits = new ArrayList<>();
    Set<String> seen = new HashSet<>();
    try (CloseableIterable<FileScanTask> tasks = table.newScan().planFiles()) {
      for (FileScanTask task : tasks) {
        String path = task.file().location();
        if (task.file().format() != FileFormat.PARQUET || !seen.add(path)) {
          continue;
        }
        try (CloseableIterable<Record> rows =
            Parquet.read(table.io().newInputFile(path))
                .project(keySchema)
                .createReaderFunc(fileSchema -> GenericParquetReaders.buildReader(keySchema, fileSchema))
                .build()) {
          long pos = 0;
          for (Record row : rows) {
            Object key = row.getField(keyColumn);
            if (key instanceof Number n && keys.contains(n.longValue())) {
              hits.add(new Hit(path, pos));
            }
            pos++;
          }
        }
      }
    }
    if (hits.isEmpty()) {
      System.err.println("IcebergPositionDelete: no row has any of the keys " + keys);
      System.exit(1);
    }
    hits.sort(Comparator.comparing(Hit::path).thenComparingLong(Hit::pos));

    String location =
        table.locationProvider().newDataLocation("foreign-position-deletes-" + UUID.randomUUID() + ".parquet");
    PositionDeleteWriter<Record> writer =
        Parquet.writeDeletes(table.io().newOutputFile(location))
            .forTable(table)
            .rowSchema(null) // file_path and pos only, no deleted row
            .withSpec(table.spec())
            .overwrite()
            .buildPositionWriter();
    PositionDelete<Record> delete = PositionDelete.create();
    try {
      for (Hit hit : hits) {
        writer.write(delete.set(hit.path(), hit.pos(), null));
      }
    } finally {
      writer.close();
    }
    DeleteFile file = writer.toDeleteFile();
    table.newRowDelta().addDeletes(file).commit();
    catalog.close();

    Set<String> named = new TreeSet<>();
    hits.forEach(h -> named.add(h.path()));
    String referenced = file.referencedDataFile();
    System.out.println(
        "{\"data_files\": " + named.size()
            + ", \"deleted\": " + hits.size()
            + ", \"delete_file\": \"" + file.location() + "\""
            + ", \"referenced_data_file\": " + (referenced == null ? "null" : "\"" + referenced + "\"")
            + "}");
  }
}
